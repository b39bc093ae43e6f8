#include "sharding/SecondaryShards.h"

#include <ATen/ATen.h>

#include "common/Error.h"

namespace zeroshard {

SecondaryShards::SecondaryShards(Collectives* comm, size_t units, MemoryLedger* ledger)
    : comm_(comm), ledger_(ledger), parts_(units), entries_(units), valid_(units, false) {}

// The flat buffer holds comm world equal chunks (its padding is a multiple of every
// rank's aligned shard, and the group size divides the world): chunk `rank` is ours.
at::Tensor SecondaryShards::slice_of(const at::Tensor& flat) const {
  const int64_t part = flat.numel() / comm_->world();
  return flat.narrow(0, comm_->rank() * part, part);
}

void SecondaryShards::keep(size_t unit, const FlatParamGroup& group) {
  if (!group.gathered()) fail("hpZ: unit {} is not gathered; there is nothing to keep", unit);
  const at::Tensor slice = slice_of(group.flat());
  at::Tensor& part = parts_.at(unit);
  if (!part.defined()) {
    part = at::empty_like(slice);
    entries_[unit] = LedgerEntry(ledger_, Tier::Device, Kind::SecondaryParams,
                                 slice.numel() * static_cast<int64_t>(slice.element_size()));
  }
  part.copy_(slice);
  valid_[unit] = true;
}

CommHandle SecondaryShards::gather(size_t unit, FlatParamGroup& group) {
  if (!holds(unit)) fail("hpZ: unit {} has no valid secondary copy to gather from", unit);
  group.allocate_full(/*fill_own_shard=*/false);
  slice_of(group.flat()).copy_(parts_[unit]);
  return comm_->all_gather(group.flat());
}

void SecondaryShards::invalidate() {
  std::fill(valid_.begin(), valid_.end(), false);
}

}  // namespace zeroshard
