#include "offload/PinnedPool.h"

#include <cstdlib>

#include "common/Alignment.h"
#include "common/Error.h"
#include "offload/IoEngine.h"
#include "offload/PageLock.h"

namespace zeroshard {

PinnedPool::PinnedPool(int64_t count, int64_t bytes_each, MemoryLedger* ledger, bool page_lock)
    : bytes_each_(round_up(bytes_each, kIoAlignment)) {
  if (count < 1) fail("pinned buffer count: {} is not allowed; use >= 1", count);
  for (int64_t i = 0; i < count; ++i) {
    void* p = std::aligned_alloc(kIoAlignment,
                                 static_cast<size_t>(std::max<int64_t>(bytes_each_, kIoAlignment)));
    if (p == nullptr) {
      for (void* q : buffers_) std::free(q);
      fail("cannot allocate {} pinned buffers of {} bytes", count, bytes_each_);
    }
    buffers_.push_back(p);
    free_.push_back(count - 1 - i);
  }
  entry_ = LedgerEntry(ledger, Tier::Host, Kind::PinnedBuffers, count * bytes_each_);
  // All or none: a refusal part-way (the lock limit reached) unlocks what was locked.
  if (!page_lock) return;
  size_t locked = 0;
  while (locked < buffers_.size() && zeroshard::page_lock(buffers_[locked], bytes_each_)) ++locked;
  locked_ = locked == buffers_.size();
  if (!locked_)
    for (size_t i = 0; i < locked; ++i) page_unlock(buffers_[i]);
}

PinnedPool::~PinnedPool() {
  for (void* p : buffers_) {
    if (locked_) page_unlock(p);
    std::free(p);
  }
}

std::vector<std::pair<void*, int64_t>> PinnedPool::all() const {
  std::vector<std::pair<void*, int64_t>> out;
  for (void* p : buffers_) out.emplace_back(p, bytes_each_);
  return out;
}

int64_t PinnedPool::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return !free_.empty(); });
  const int64_t index = free_.back();
  free_.pop_back();
  return index;
}

void PinnedPool::release(int64_t index) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(index);
  }
  cv_.notify_one();
}

}  // namespace zeroshard
