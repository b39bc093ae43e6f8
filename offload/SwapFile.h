#pragma once
// Swap space on NVMe. A SwapDir is this process's own directory under nvme_path
// (mode 0700, a fresh unique name, held by an flock for the process's life), removed
// with everything in it at exit. A later run never reuses one: it removes directories
// whose owner has died (their lock is free) and makes its own.
// A SwapFile is one preallocated file in it (fallocate: ENOSPC shows at start-up, with
// the bytes needed and free), opened with O_DIRECT where the file system allows it and
// O_NOFOLLOW always.
#include <cstdint>
#include <string>

#include "offload/IoEngine.h"

namespace zeroshard {

class SwapDir {
 public:
  // `tag` becomes part of the name (e.g. "rank3") so a listing says whose it is.
  SwapDir(const std::string& nvme_path, const std::string& tag);
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;
  const std::string& path() const { return path_; }

  // Removes swap directories under nvme_path left by processes that died; returns
  // how many it removed.
  static int remove_stale(const std::string& nvme_path);

 private:
  std::string path_;
  int lock_fd_ = -1;
};

class SwapFile {
 public:
  SwapFile(const std::string& dir, const std::string& name, int64_t bytes);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  const IoFile& file() const { return file_; }
  int64_t bytes() const { return bytes_; }
  // Reserves the file up to `bytes` (ENOSPC said as at construction); never shrinks it.
  void grow(int64_t bytes);

 private:
  void reserve(int64_t offset, int64_t length);
  IoFile file_;
  int64_t bytes_;
};

}  // namespace zeroshard
