#include "optim/ShardUploads.h"

#include <ATen/ATen.h>

#include "common/Error.h"

namespace zeroshard {

ShardUploads::ShardUploads(c10::Device device, MemoryLedger* ledger, bool page_lock)
    : stream_(device), ledger_(ledger), page_lock_(page_lock) {}

ShardUploads::~ShardUploads() {
  for (const CopyDone& done : last_read_) done.wait();
}

void ShardUploads::reserve(int64_t bytes) {
  if (slots_) fail("ShardUploads: staging reserved twice");
  slots_ = std::make_unique<PinnedPool>(2, bytes, ledger_, page_lock_);
}

at::Tensor ShardUploads::staging(at::ScalarType dtype, int64_t count) {
  const int64_t bytes = count * static_cast<int64_t>(c10::elementSize(dtype));
  if (!slots_ || bytes > slots_->bytes_each()) {
    fail("ShardUploads: a part of {} bytes does not fit the staging slots of {} bytes", bytes,
         slot_bytes());
  }
  const size_t slot = next_;
  next_ = 1 - next_;
  last_read_[slot].wait();
  return at::from_blob(slots_->buffer(static_cast<int64_t>(slot)), {count},
                       at::TensorOptions().dtype(dtype));
}

void ShardUploads::upload(const at::Tensor& dst, const at::Tensor& staging) {
  const size_t slot = 1 - next_;  // the one staging() handed out last
  if (!slots_ || staging.data_ptr() != slots_->buffer(static_cast<int64_t>(slot))) {
    fail("ShardUploads: upload() takes the slot staging() handed out last");
  }
  last_read_[slot] = stream_.copy(dst, staging);
}

// Any upload older than the slots' last two has ended: its slot was waited on before the
// next part was written into it.
void ShardUploads::wait_all() {
  for (const CopyDone& done : last_read_) done.wait();
}

void ShardUploads::order_before_current() {
  for (const CopyDone& done : last_read_) done.before_current();
}

}  // namespace zeroshard
