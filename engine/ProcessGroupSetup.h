#pragma once
// Rendezvous through c10d's TCPStore, then process groups for the model's device:
// Gloo for CPU tensors, NCCL for CUDA tensors (engine/NcclGroup). One process (world
// size 1) gets no group: every collective is then a no-op.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <c10/core/Device.h>

#include "config/LaunchEnv.h"

namespace zeroshard {

struct DistContext {
  LaunchEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> group;  // null when world_size == 1
  // A second group for stage-3 parameter gathers, issued from inside backward in
  // schedule order while gradient reductions go on in theirs: each group sees one
  // fixed order on every rank.
  c10::intrusive_ptr<c10d::Backend> param_group;
  // Stage-3 gathers outside forward and backward (a parameter read between steps,
  // gathered_parameters, full_parameters), which no schedule orders: on their own group,
  // a rank that makes one alone waits there until the timeout and never pairs it with
  // another rank's scheduled gather.
  c10::intrusive_ptr<c10d::Backend> touch_group;
  // Sharding inside groups of `shard_size` consecutive ranks (mics_shard_size): `group`
  // and `param_group` stay over every rank for broadcasts, barriers and checkpoints;
  // `shard_group`, `shard_param_group` and `shard_touch_group` join this rank's group,
  // `replica_group` the
  // ranks holding the same shard in the other groups. All three are null without
  // groups (shard_size == world size) and where they would hold one rank.
  int shard_size = 1;
  c10::intrusive_ptr<c10d::Backend> shard_group;
  c10::intrusive_ptr<c10d::Backend> shard_param_group;
  c10::intrusive_ptr<c10d::Backend> shard_touch_group;
  c10::intrusive_ptr<c10d::Backend> replica_group;
  // hpZ (zero_hpz_partition_size): backward's gathers of the secondary copy, inside
  // groups of `hpz_size` consecutive ranks. Null without it, and where the group would
  // be every rank (param_group serves then).
  int hpz_size = 1;
  c10::intrusive_ptr<c10d::Backend> hpz_group;
  std::chrono::milliseconds timeout{300'000};

  int shard_rank() const { return env.rank % shard_size; }
  int replica_rank() const { return env.rank / shard_size; }
  int hpz_rank() const { return env.rank % hpz_size; }

  // After a collective failed: which ranks no longer answer, e.g. "rank 1 did not
  // respond within 3 s" (asks the survivors through the store).
  std::string describe_missing_ranks() const;
};

// True when an engine of this process has met the others at env's rendezvous in the store
// rank 0's process serves and keeps (the same answer on every rank: each builds its engines
// in the same order). torch.distributed started later must join that store, not serve it.
bool engine_serves_rendezvous(const LaunchEnv& env);

// `device`: where the model's parameters are; its groups carry tensors of that device.
// `shard_size`: ranks per shard group (a divisor of the world size; <= 0: all ranks).
// `hpz_size`: ranks per hpZ group (a divisor of the world size; <= 1: none).
// `agree`: called with the engine's store once it is made, before any process group (where
// the ranks check that they built alike: engine/RankAgreement.h).
DistContext init_distributed(const LaunchEnv& env, std::chrono::milliseconds timeout,
                             c10::Device device = c10::Device(c10::kCPU), int shard_size = -1,
                             int hpz_size = 1, const std::function<void(c10d::Store&)>& agree = {});

}  // namespace zeroshard
