#pragma once
// A fixed set of equal host buffers, aligned for O_DIRECT, allocated once from the
// Plan's count and size and counted in the MemoryLedger (host tier, pinned_buffers).
// With `page_lock` (a model on a GPU) they are page-locked too, where the driver lets
// them be (offload/PageLock.h).
// Buffers of a huge page or more start on one and ask for transparent huge pages, so
// each transfer reaches the device in few segments (PinnedPool.cpp says why).
// Buffers are handed out and returned by index; acquire() blocks while all are in use.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "common/MemoryLedger.h"

namespace zeroshard {

// A host buffer of `bytes` (at least kIoAlignment) aligned for O_DIRECT, on huge pages when
// it holds one; freed with std::free. nullptr when the allocation fails.
void* allocate_io_buffer(int64_t bytes);

class PinnedPool {
 public:
  PinnedPool(int64_t count, int64_t bytes_each, MemoryLedger* ledger, bool page_lock = false);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  int64_t count() const { return static_cast<int64_t>(buffers_.size()); }
  int64_t bytes_each() const { return bytes_each_; }
  bool page_locked() const { return locked_; }
  void* buffer(int64_t index) const { return buffers_.at(static_cast<size_t>(index)); }
  std::vector<std::pair<void*, int64_t>> all() const;

  int64_t acquire();  // index of a free buffer
  void release(int64_t index);

 private:
  int64_t bytes_each_;
  std::vector<void*> buffers_;
  bool locked_ = false;  // every buffer page-locked
  std::vector<int64_t> free_;
  std::mutex mutex_;
  std::condition_variable cv_;
  LedgerEntry entry_;
};

}  // namespace zeroshard
