#include "offload/PinnedPool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "common/Alignment.h"
#include "common/Error.h"
#include "offload/IoEngine.h"
#include "offload/PageLock.h"

namespace zeroshard {

// A buffer of at least one huge page starts on a huge-page boundary and asks for
// transparent huge pages over every whole one it holds (the tail, if any, keeps small
// pages, so nothing beyond its own bytes is resident). Physically contiguous memory lets
// a block-sized transfer reach the device in one segment: in scattered 4 KiB pages a
// 1 MiB transfer has 256, more than the 254 this machine's virtio disk takes in one
// request, so the kernel splits it. Measured (docs/architecture.md, "Swap buffers"): a
// pool allocated first in a process moved the same file 1.2-1.7x slower than one
// allocated later; with huge pages the two took the same time (0.94-1.05x).
void* allocate_io_buffer(int64_t bytes) {
  const int64_t size = std::max(bytes, kIoAlignment);
  const bool huge = size >= kHugePageBytes;
  void* p = nullptr;
  if (posix_memalign(&p, static_cast<size_t>(huge ? kHugePageBytes : kIoAlignment),
                     static_cast<size_t>(size)) != 0)
    return nullptr;
  // Advice only: where the kernel has no huge pages (THP off), the buffer works as before.
  if (huge)
    ::madvise(p, static_cast<size_t>(size / kHugePageBytes * kHugePageBytes), MADV_HUGEPAGE);
  return p;
}

PinnedPool::PinnedPool(int64_t count, int64_t bytes_each, MemoryLedger* ledger, bool page_lock)
    : bytes_each_(round_up(bytes_each, kIoAlignment)) {
  if (count < 1) fail("pinned buffer count: {} is not allowed; use >= 1", count);
  for (int64_t i = 0; i < count; ++i) {
    void* p = allocate_io_buffer(bytes_each_);
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
