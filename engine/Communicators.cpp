#include "engine/Communicators.h"

#include <algorithm>

#include <fmt/format.h>

namespace zeroshard {

Communicators::Communicators(const DistContext& dist, MemoryLedger* ledger, bool check) {
  auto diagnose = [&dist] { return dist.describe_missing_ranks(); };
  const int rank = dist.env.rank, world = dist.env.world_size;
  // A wait goes to the store once it has lasted a quarter of the timeout (at most 5 s), so
  // that the rank whose collective times out finds what the others wait on.
  const auto publish_after = std::clamp<std::chrono::milliseconds>(
      dist.timeout / 4, std::chrono::milliseconds(100), std::chrono::seconds(5));
  watch_ = std::make_unique<CollectiveWatch>(dist.store, rank, world, publish_after);
  auto make = [&](const c10::intrusive_ptr<c10d::Backend>& group, int in_group, int size,
                  std::string name) {
    CollectiveOptions o;
    o.name = std::move(name);
    o.store = dist.store;
    o.watch = watch_.get();
    o.check = check;
    return std::make_unique<Collectives>(group, in_group, size, diagnose, ledger, std::move(o));
  };
  world_ = make(dist.group, rank, world, "world");
  if (dist.hpz_group) {
    hpz_ = make(dist.hpz_group, dist.hpz_rank(), dist.hpz_size,
                fmt::format("hpz{}", rank / dist.hpz_size));
  }
  if (dist.shard_size == world) {
    params_ = make(dist.param_group, rank, world, "params");
    touches_ = make(dist.touch_group, rank, world, "touches");
    return;
  }
  const int size = dist.shard_size, groups = world / size, in_group = dist.shard_rank();
  const int shard_group = rank / size;
  group_ = make(dist.shard_group, in_group, size, fmt::format("shard{}", shard_group));
  params_ =
      make(dist.shard_param_group, in_group, size, fmt::format("shard{}/params", shard_group));
  touches_ =
      make(dist.shard_touch_group, in_group, size, fmt::format("shard{}/touches", shard_group));
  replicas_ = make(dist.replica_group, dist.replica_rank(), groups,
                   fmt::format("replica{}", dist.shard_rank()));
}

int64_t Communicators::bytes_sent() const {
  int64_t sent = 0;
  for (const auto* c : {&world_, &group_, &params_, &touches_, &replicas_, &hpz_})
    if (*c) sent += (*c)->bytes_sent();
  return sent;
}

}  // namespace zeroshard
