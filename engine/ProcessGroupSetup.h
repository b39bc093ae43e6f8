#pragma once
// Rendezvous through c10d's TCPStore, then process groups for the model's device:
// Gloo for CPU tensors, NCCL for CUDA tensors (engine/NcclGroup). One process (world
// size 1) gets no group: every collective is then a no-op.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <c10/core/Device.h>

#include "config/LaunchEnv.h"
#include "engine/ParallelDims.h"

namespace zeroshard {

// What a process group carries: each stream of collectives that ranks may issue in
// different interleavings has a group of its own, so that every group sees one fixed order
// on every rank (engine/Communicators.h).
//   Main    reductions, broadcasts, barriers, checkpoints;
//   Params  stage-3 gathers, issued from inside backward in schedule order while gradient
//           reductions go on in Main's;
//   Touch   stage-3 gathers outside forward and backward (a parameter read between steps,
//           full_parameters), which no schedule orders: a rank that makes one alone waits
//           there until the timeout and never pairs it with another rank's scheduled gather.
enum class GroupStream { Main, Params, Touch };

struct DistContext {
  LaunchEnv env;
  ParallelDims dims;  // the job's named dimensions (engine/ParallelDims.h)
  c10::intrusive_ptr<c10d::Store> store;
  std::chrono::milliseconds timeout{300'000};

  // Every rank's group for `stream`; null with one process on the host, and with tensor or
  // pipeline parallelism (the engine's collectives never span the world then).
  c10::intrusive_ptr<c10d::Backend> world(GroupStream stream) const;
  // This rank's data-parallel group for `stream` (the world without tensor parallelism);
  // null where it is one rank on the host.
  c10::intrusive_ptr<c10d::Backend> data_parallel(GroupStream stream) const;
  // This rank's group of dimension `dim` for `stream`; null where the dimension has no group
  // of its own (one rank, or every rank: world() serves then). Made: dp's and dp_shard's for
  // every stream, edp's for every stream, dp_replicate's, tp's and pp's for Main, hpz's for
  // Params.
  c10::intrusive_ptr<c10d::Backend> group(Dim dim, GroupStream stream) const;
  void set_group(std::optional<Dim> dim, GroupStream stream,
                 c10::intrusive_ptr<c10d::Backend> backend);

  // This rank's shard and the number of shards (the dp_shard dimension).
  int shard_rank() const { return dims.coordinate(Dim::DpShard); }
  int shard_size() const { return dims.size(Dim::DpShard); }
  // The same for a group of expert parameters (NamedParam::expert): its edp group's.
  int shard_rank(bool expert) const { return expert ? dims.coordinate(Dim::Edp) : shard_rank(); }
  int shard_size(bool expert) const { return expert ? dims.size(Dim::Edp) : shard_size(); }

  // After a collective failed: which ranks no longer answer, e.g. "rank 1 did not
  // respond within 3 s" (asks the survivors through the store).
  std::string describe_missing_ranks() const;

 private:
  // Keyed by (dimension, or none for the world; stream).
  std::map<std::pair<std::optional<Dim>, GroupStream>, c10::intrusive_ptr<c10d::Backend>> groups_;
};

// True when an engine of this process has met the others at env's rendezvous in the store
// rank 0's process serves and keeps (the same answer on every rank: each builds its engines
// in the same order). torch.distributed started later must join that store, not serve it.
bool engine_serves_rendezvous(const LaunchEnv& env);

// `device`: where the model's parameters are; its groups carry tensors of that device.
// `shard_size`: ranks per shard group (a divisor of the world size; <= 0: all ranks).
// `hpz_size`: ranks per hpZ group (a divisor of the world size; <= 1: none).
// `tp_size`: ranks per tensor-parallel group; `pp_size`: pipeline stages; the sizes above
// then divide world / (pp * tp). `ep_size`: ranks per expert-parallel group.
// `agree`: called with the engine's store once it is made, before any process group (where
// the ranks check that they built alike: engine/RankAgreement.h).
DistContext init_distributed(const LaunchEnv& env, std::chrono::milliseconds timeout,
                             c10::Device device = c10::Device(c10::kCPU), int shard_size = -1,
                             int hpz_size = 1, const std::function<void(c10d::Store&)>& agree = {},
                             int tp_size = 1, int pp_size = 1, int ep_size = 1);

}  // namespace zeroshard
