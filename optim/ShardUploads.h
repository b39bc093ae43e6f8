#pragma once
// Updated parameter shards on their way back to the GPU. CPU Adam writes each part of a
// shard in compute precision into page-locked staging, and the part is copied into the
// shard on a copy stream while Adam goes on with the next (sharding/CopyStream.h).
// Staging is two slots of exactly the largest part's bytes, allocated once and counted
// under Host/PinnedBuffers for as long as they live (torch's caching host allocator
// would round each part up to a power of two and keep every size it was asked for). A
// part written into a slot waits first for the copy that last read that slot, so at most
// two parts are in flight.
#include <array>
#include <memory>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "common/MemoryLedger.h"
#include "offload/PinnedPool.h"
#include "sharding/CopyStream.h"

namespace zeroshard {

class ShardUploads {
 public:
  // `page_lock`: lock the slots for the GPU's copies (false on the host, as in tests).
  ShardUploads(c10::Device device, MemoryLedger* ledger, bool page_lock = true);
  ~ShardUploads();  // after every copy that reads a slot has ended
  ShardUploads(const ShardUploads&) = delete;
  ShardUploads& operator=(const ShardUploads&) = delete;

  // Allocates the two slots, `bytes` each: the largest part there will be.
  void reserve(int64_t bytes);
  int64_t slot_bytes() const { return slots_ ? slots_->bytes_each() : 0; }
  // Staging for `count` elements of `dtype`: the next slot, once the copy that last read
  // it has ended. Pass it to upload() before asking for the next one.
  at::Tensor staging(at::ScalarType dtype, int64_t count);
  // dst <- staging (what staging() handed out last) on the copy stream.
  void upload(const at::Tensor& dst, const at::Tensor& staging);
  // The host waits until no upload is in flight.
  void wait_all();
  // The calling thread's current stream waits (on the device) for every upload issued
  // so far; the host does not.
  void order_before_current();

 private:
  CopyStream stream_;
  MemoryLedger* ledger_;
  bool page_lock_;
  std::unique_ptr<PinnedPool> slots_;
  std::array<CopyDone, 2> last_read_;  // per slot: the copy that read it last
  size_t next_ = 0;                    // the slot staging() hands out next
};

}  // namespace zeroshard
