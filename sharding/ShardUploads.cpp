#include "sharding/ShardUploads.h"

#include <ATen/ATen.h>

namespace zeroshard {

ShardUploads::ShardUploads(c10::Device device, MemoryLedger* ledger)
    : stream_(device), ledger_(ledger) {}

at::Tensor ShardUploads::staging(const at::Tensor& shard, int64_t count) {
  return at::empty({count}, shard.options().device(at::kCPU).pinned_memory(true));
}

void ShardUploads::upload(const at::Tensor& dst, const at::Tensor& staging) {
  wait(1);  // at most two staging buffers at a time
  Upload u;
  u.staging_bytes = LedgerEntry(ledger_, Tier::Host, Kind::PinnedBuffers, staging.nbytes());
  u.done = stream_.copy(dst, staging);
  in_flight_.push_back(std::move(u));
}

void ShardUploads::wait(size_t keep) {
  while (in_flight_.size() > keep) {
    in_flight_.front().done.wait();
    in_flight_.pop_front();
  }
}

void ShardUploads::order_before_current() {
  for (const Upload& u : in_flight_) u.done.before_current();
  in_flight_.clear();  // their staging stays with torch's host allocator until they end
}

}  // namespace zeroshard
