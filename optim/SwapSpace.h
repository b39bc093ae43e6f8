#pragma once
// Where offloaded state goes on NVMe: this rank's swap directories, one per nvme_path
// asked for (made 0700, removed at exit: offload/SwapFile.h), and the one I/O engine every
// swap file goes through, made with the first directory. The engine holds this before
// everything that swaps, so both outlive their users.
#include <memory>
#include <string>
#include <vector>

#include "offload/IoEngine.h"
#include "offload/SwapFile.h"

namespace zeroshard {

class SwapSpace {
 public:
  SwapSpace(IoOptions io, int rank);
  ~SwapSpace();
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;

  // A new swap directory for this rank under `nvme_path`; io() is set from here on.
  const std::string& open_dir(const std::string& nvme_path);
  IoEngine* io() { return io_.get(); }

 private:
  IoOptions options_;
  int rank_;
  std::unique_ptr<IoEngine> io_;
  std::vector<std::unique_ptr<SwapDir>> dirs_;
};

}  // namespace zeroshard
