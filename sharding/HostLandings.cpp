#include "sharding/HostLandings.h"

#include <ATen/ATen.h>

namespace zeroshard {

HostLandings::HostLandings(c10::Device device, std::vector<at::Tensor>* accumulators,
                           MemoryLedger* ledger)
    : copies_(device),
      accumulators_(accumulators),
      ledger_(ledger),
      landings_(accumulators->size()),
      mutexes_(std::make_unique<std::mutex[]>(accumulators->size())) {}

void HostLandings::land(size_t g, const at::Tensor& received, bool clean) {
  // Bounded: settle the oldest (most likely ended already) before another begins.
  while (order_.size() >= 2) {
    settle(order_.front());
    order_.pop_front();
  }
  settle(g);  // an earlier landing of this group, if one is left
  const int64_t bytes = received.numel() * 4;
  at::Tensor& accumulator = (*accumulators_)[g];
  std::lock_guard<std::mutex> lock(mutexes_[g]);
  Landing l;
  l.device_bytes = LedgerEntry(ledger_, Tier::Device, Kind::CommBuckets, bytes);
  if (clean) {  // straight into the accumulator
    l.done = copies_.copy(accumulator, received);
  } else {
    l.staging = at::empty(accumulator.sizes(), accumulator.options().pinned_memory(true));
    l.host_bytes = LedgerEntry(ledger_, Tier::Host, Kind::PinnedBuffers, bytes);
    l.done = copies_.copy(l.staging, received);
  }
  landings_[g] = std::move(l);
  order_.push_back(g);
}

void HostLandings::settle(size_t g) {
  std::lock_guard<std::mutex> lock(mutexes_[g]);
  std::optional<Landing>& l = landings_.at(g);
  if (!l) return;
  l->done.wait();
  if (l->staging.defined()) (*accumulators_)[g].add_(l->staging);
  l.reset();
}

void HostLandings::settle_all() {
  for (size_t g = 0; g < landings_.size(); ++g) settle(g);
  order_.clear();
}

}  // namespace zeroshard
