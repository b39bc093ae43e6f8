#include "offload/IoEngine.h"

#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "common/Error.h"
#include "common/Logging.h"

namespace zeroshard {

struct IoEngine::Request {
  IoOp op;
  IoFile file;
  std::promise<void> promise;
  std::atomic<int64_t> pieces_left{0};
  std::mutex mutex;
  std::string error;  // the first piece's failure

  void piece_done(const std::string& failure) {
    if (!failure.empty()) {
      std::lock_guard<std::mutex> lock(mutex);
      if (error.empty()) error = failure;
    }
    if (pieces_left.fetch_sub(1) != 1) return;
    if (error.empty()) {
      promise.set_value();
    } else {
      promise.set_exception(std::make_exception_ptr(Error(error)));
    }
  }
};

namespace {

struct Piece {
  std::shared_ptr<IoEngine::Request> request;
  char* buffer = nullptr;
  int64_t length = 0;
  int64_t offset = 0;
  int64_t done = 0;  // bytes already transferred (short transfers)
};

const char* op_name(IoOp op) {
  return op == IoOp::Read ? "read" : "write";
}

std::string failure_text(const Piece& p, int error) {
  std::string text = fmt::format("{} of {} bytes at offset {} of {} failed: {} (errno {})",
                                 op_name(p.request->op), p.length - p.done, p.offset + p.done,
                                 p.request->file.path, std::strerror(error), error);
  if (error == EINVAL && p.request->file.direct) {
    text += fmt::format("; O_DIRECT needs buffers, sizes and offsets aligned to {} bytes",
                        kIoAlignment);
  }
  return text;
}

// What a piece's transfer of `result` bytes (or -errno) means: "" = go on, else the error.
// Advances p.done; `finished` tells whether the piece is complete.
std::string account(Piece& p, int result, bool& finished) {
  finished = false;
  if (result == -EINTR || result == -EAGAIN) return "";
  if (result < 0) {
    finished = true;
    return failure_text(p, -result);
  }
  if (result == 0) {
    finished = true;
    return fmt::format("{} of {} bytes at offset {} of {} failed: short {} (0 bytes; file ends)",
                       op_name(p.request->op), p.length - p.done, p.offset + p.done,
                       p.request->file.path, op_name(p.request->op));
  }
  p.done += result;
  finished = p.done >= p.length;
  return "";
}

}  // namespace

class IoEngine::Worker {
 public:
  Worker(const IoOptions& options, bool uring, const std::shared_ptr<IoCompletionHook>* hook)
      : depth_(std::max(1, options.queue_depth)), hook_(hook) {
    if (uring) uring_ = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0) == 0;
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (uring_) io_uring_queue_exit(&ring_);
  }
  bool uring() const { return uring_; }
  void start() {
    thread_ = std::thread([this] { uring_ ? run_uring() : run_sync(); });
  }

  void push(Piece piece) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(piece));
    }
    cv_.notify_one();
  }

  bool register_buffers(const std::vector<std::pair<void*, int64_t>>& buffers) {
    std::vector<iovec> iov;
    for (const auto& [ptr, bytes] : buffers) iov.push_back({ptr, static_cast<size_t>(bytes)});
    if (io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size())) != 0)
      return false;
    for (const auto& [ptr, bytes] : buffers) fixed_.emplace_back(static_cast<char*>(ptr), bytes);
    return true;
  }

 private:
  int apply_hook(const Piece& p, int result) {
    const auto& hook = *hook_;
    if (!hook || !*hook) return result;
    return (*hook)(p.request->op, p.request->file, p.offset + p.done, p.length - p.done, result);
  }

  // Index of the registered buffer holding the piece's remainder, or -1.
  int fixed_index(const Piece& p) const {
    const char* begin = p.buffer + p.done;
    for (size_t i = 0; i < fixed_.size(); ++i) {
      const auto& [base, bytes] = fixed_[i];
      if (begin >= base && begin + (p.length - p.done) <= base + bytes) return static_cast<int>(i);
    }
    return -1;
  }

  void prepare(Piece* p) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    char* buf = p->buffer + p->done;
    const auto len = static_cast<unsigned>(p->length - p->done);
    const auto off = static_cast<uint64_t>(p->offset + p->done);
    const int fd = p->request->file.fd;
    const int index = fixed_index(*p);
    const bool read = p->request->op == IoOp::Read;
    if (index >= 0 && read) {
      io_uring_prep_read_fixed(sqe, fd, buf, len, off, index);
    } else if (index >= 0) {
      io_uring_prep_write_fixed(sqe, fd, buf, len, off, index);
    } else if (read) {
      io_uring_prep_read(sqe, fd, buf, len, off);
    } else {
      io_uring_prep_write(sqe, fd, buf, len, off);
    }
    io_uring_sqe_set_data(sqe, p);
  }

  // Takes queued pieces while the ring has room; false when told to stop and idle.
  bool take(std::vector<Piece*>& out, int in_flight) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (in_flight == 0) cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_ && queue_.empty() && in_flight == 0) return false;
    while (!queue_.empty() && in_flight + static_cast<int>(out.size()) < depth_) {
      out.push_back(new Piece(std::move(queue_.front())));
      queue_.pop_front();
    }
    return true;
  }

  void complete(Piece* p, int result, int& in_flight, bool& resubmitted) {
    bool finished = false;
    const std::string failure = account(*p, apply_hook(*p, result), finished);
    if (!finished) {
      prepare(p);  // the remainder of a short transfer, or a retry
      resubmitted = true;
      return;
    }
    --in_flight;
    p->request->piece_done(failure);
    delete p;
  }

  void run_uring() {
    int in_flight = 0;
    for (;;) {
      std::vector<Piece*> fresh;
      if (!take(fresh, in_flight)) return;
      for (Piece* p : fresh) prepare(p);
      in_flight += static_cast<int>(fresh.size());
      if (!fresh.empty()) io_uring_submit(&ring_);
      if (in_flight == 0) continue;
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) != 0) continue;
      bool resubmitted = false;
      do {
        auto* p = static_cast<Piece*>(io_uring_cqe_get_data(cqe));
        const int result = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        complete(p, result, in_flight, resubmitted);
      } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
      if (resubmitted) io_uring_submit(&ring_);
    }
  }

  void run_sync() {
    std::vector<Piece*> one;
    while (take(one, 0)) {
      for (Piece* p : one) {
        bool finished = false;
        std::string failure;
        while (!finished && failure.empty()) {
          const int fd = p->request->file.fd;
          const auto len = static_cast<size_t>(p->length - p->done);
          const off_t off = p->offset + p->done;
          const ssize_t n = p->request->op == IoOp::Read
                                ? ::pread(fd, p->buffer + p->done, len, off)
                                : ::pwrite(fd, p->buffer + p->done, len, off);
          failure = account(*p, apply_hook(*p, n < 0 ? -errno : static_cast<int>(n)), finished);
        }
        p->request->piece_done(failure);
        delete p;
      }
      one.clear();
    }
  }

  int depth_;
  const std::shared_ptr<IoCompletionHook>* hook_;
  io_uring ring_{};
  bool uring_ = false;
  std::vector<std::pair<char*, int64_t>> fixed_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Piece> queue_;
  bool stop_ = false;
  std::thread thread_;
};

IoEngine::IoEngine(const IoOptions& options)
    : options_(options), hook_(std::make_shared<IoCompletionHook>()) {
  if (options_.block_size <= 0 || options_.block_size % kIoAlignment != 0) {
    fail("aio.block_size: {} is not allowed; use a positive multiple of {}", options_.block_size,
         kIoAlignment);
  }
  if (options_.queue_depth < 1)
    fail("aio.queue_depth: {} is not allowed; use >= 1", options_.queue_depth);
  if (options_.rings < 1) {
    fail("aio.intra_op_parallelism: {} is not allowed; use >= 1", options_.rings);
  }
  const char* forced = std::getenv("ZS_IO_BACKEND");
  bool try_uring = options_.use_io_uring && !(forced && std::string(forced) == "threads");
  for (int i = 0; i < options_.rings; ++i) {
    workers_.push_back(std::make_unique<Worker>(options_, try_uring, &hook_));
    if (try_uring && !workers_.back()->uring()) {
      log_warn("io_uring refused by the kernel ({}); swap I/O uses a pread/pwrite thread pool",
               std::strerror(errno));
      try_uring = false;
      workers_.clear();
      i = -1;
    }
  }
  uring_ = try_uring;
  if (!uring_) {
    // Blocking calls: one thread per request kept in flight.
    const int threads = options_.rings * std::max(1, std::min(options_.queue_depth, 8));
    while (static_cast<int>(workers_.size()) < threads)
      workers_.push_back(std::make_unique<Worker>(options_, false, &hook_));
  }
  for (auto& w : workers_) w->start();
}

IoEngine::~IoEngine() = default;

void IoEngine::set_completion_hook(IoCompletionHook hook) {
  *hook_ = std::move(hook);
}

bool IoEngine::register_buffers(const std::vector<std::pair<void*, int64_t>>& buffers) {
  if (!uring_ || buffers.empty()) return false;
  for (auto& w : workers_) {
    if (!w->register_buffers(buffers)) {
      log_warn(
          "io_uring could not register {} pinned buffers (RLIMIT_MEMLOCK too low?); swap I/O "
          "uses plain buffers",
          buffers.size());
      return false;
    }
  }
  return true;
}

std::future<void> IoEngine::submit(IoOp op, const IoFile& file, char* buffer, int64_t bytes,
                                   int64_t offset) {
  auto request = std::make_shared<Request>();
  request->op = op;
  request->file = file;
  auto future = request->promise.get_future();
  if (bytes <= 0) {
    request->promise.set_value();
    return future;
  }
  const int64_t block = options_.block_size;
  const int64_t pieces = std::max<int64_t>(1, (bytes + block - 1) / block);
  request->pieces_left = pieces;
  for (int64_t i = 0; i < pieces; ++i) {
    Piece p;
    p.request = request;
    p.buffer = buffer + i * block;
    p.offset = offset + i * block;
    p.length = std::min(block, bytes - i * block);
    workers_[next_worker_]->push(std::move(p));
    next_worker_ = (next_worker_ + 1) % workers_.size();
  }
  return future;
}

std::future<void> IoEngine::read(const IoFile& file, void* buffer, int64_t bytes, int64_t offset) {
  return submit(IoOp::Read, file, static_cast<char*>(buffer), bytes, offset);
}

std::future<void> IoEngine::write(const IoFile& file, const void* buffer, int64_t bytes,
                                  int64_t offset) {
  return submit(IoOp::Write, file, static_cast<char*>(const_cast<void*>(buffer)), bytes, offset);
}

}  // namespace zeroshard
