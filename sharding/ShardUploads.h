#pragma once
// Updated parameter shards on their way back to the GPU. CPU Adam writes each part of a
// shard in compute precision into page-locked staging, and the part is copied into the
// shard on a copy stream while Adam goes on with the next (sharding/CopyStream.h). At
// most two parts are in flight, so staging stays two parts' worth; each is counted under
// Host/PinnedBuffers while its copy runs.
#include <deque>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "common/MemoryLedger.h"
#include "sharding/CopyStream.h"

namespace zeroshard {

class ShardUploads {
 public:
  ShardUploads(c10::Device device, MemoryLedger* ledger);

  // Page-locked staging for `count` elements of `shard`'s dtype, from torch's caching
  // host allocator: kept until the copy that reads it has ended, so it may be dropped
  // once upload() has it.
  static at::Tensor staging(const at::Tensor& shard, int64_t count);
  // dst <- staging on the copy stream, after the older of two uploads in flight ends.
  void upload(const at::Tensor& dst, const at::Tensor& staging);
  // The host waits until at most `keep` uploads are in flight.
  void wait(size_t keep);
  // The calling thread's current stream waits (on the device) for every upload issued
  // so far; the host does not.
  void order_before_current();

 private:
  struct Upload {
    CopyDone done;
    LedgerEntry staging_bytes;
  };
  CopyStream stream_;
  MemoryLedger* ledger_;
  std::deque<Upload> in_flight_;  // since the last order_before_current(), oldest first
};

}  // namespace zeroshard
