#pragma once
// Asynchronous file I/O for swap files: each request is cut into block_size pieces that
// io_uring rings (one thread each) keep up to queue_depth in flight; the caller gets a
// future per request. Short transfers are resubmitted for the remainder; any other
// failure becomes an Error naming the operation, file, offset and errno. Where the
// kernel refuses io_uring, a thread pool does the same with pread/pwrite (one warning).
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/Alignment.h"

namespace zeroshard {

struct IoOptions {
  int64_t block_size = 1 << 20;  // aio.block_size
  int queue_depth = 8;           // aio.queue_depth, per ring
  int rings = 1;                 // aio.intra_op_parallelism
  bool use_io_uring = true;      // false: the pread/pwrite thread pool
};

struct IoFile {
  int fd = -1;
  std::string path;
  bool direct = false;  // opened with O_DIRECT
};

enum class IoOp { Read, Write };

// Test hook (fault injection below the engine): sees each completed piece and may
// replace its result (bytes done, or -errno).
using IoCompletionHook =
    std::function<int(IoOp op, const IoFile& file, int64_t offset, int64_t length, int result)>;

class IoEngine {
 public:
  explicit IoEngine(const IoOptions& options);
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  std::future<void> read(const IoFile& file, void* buffer, int64_t bytes, int64_t offset);
  std::future<void> write(const IoFile& file, const void* buffer, int64_t bytes, int64_t offset);

  // Registers host buffers with every ring (fixed buffers: no page pinning per request).
  // False, after one warning, where RLIMIT_MEMLOCK or the kernel refuses.
  bool register_buffers(const std::vector<std::pair<void*, int64_t>>& buffers);

  bool uses_io_uring() const { return uring_; }
  const IoOptions& options() const { return options_; }
  void set_completion_hook(IoCompletionHook hook);

  struct Request;
  class Worker;

 private:
  std::future<void> submit(IoOp op, const IoFile& file, char* buffer, int64_t bytes,
                           int64_t offset);
  IoOptions options_;
  bool uring_ = false;
  std::shared_ptr<IoCompletionHook> hook_;
  std::vector<std::unique_ptr<Worker>> workers_;
  size_t next_worker_ = 0;
};

}  // namespace zeroshard
