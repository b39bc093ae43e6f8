#include "engine/Communicators.h"

namespace zeroshard {

Communicators::Communicators(const DistContext& dist, MemoryLedger* ledger) {
  auto diagnose = [&dist] { return dist.describe_missing_ranks(); };
  const int rank = dist.env.rank, world = dist.env.world_size;
  world_ = std::make_unique<Collectives>(dist.group, rank, world, diagnose, ledger);
  if (dist.hpz_group) {
    hpz_ = std::make_unique<Collectives>(dist.hpz_group, dist.hpz_rank(), dist.hpz_size, diagnose,
                                         ledger);
  }
  if (dist.shard_size == world) {
    params_ = std::make_unique<Collectives>(dist.param_group, rank, world, diagnose, ledger);
    touches_ = std::make_unique<Collectives>(dist.touch_group, rank, world, diagnose, ledger);
    return;
  }
  const int size = dist.shard_size, groups = world / size, in_group = dist.shard_rank();
  group_ = std::make_unique<Collectives>(dist.shard_group, in_group, size, diagnose, ledger);
  params_ = std::make_unique<Collectives>(dist.shard_param_group, in_group, size, diagnose, ledger);
  touches_ =
      std::make_unique<Collectives>(dist.shard_touch_group, in_group, size, diagnose, ledger);
  replicas_ = std::make_unique<Collectives>(dist.replica_group, dist.replica_rank(), groups,
                                            diagnose, ledger);
}

int64_t Communicators::bytes_sent() const {
  int64_t sent = 0;
  for (const auto* c : {&world_, &group_, &params_, &touches_, &replicas_, &hpz_})
    if (*c) sent += (*c)->bytes_sent();
  return sent;
}

}  // namespace zeroshard
