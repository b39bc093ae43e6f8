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
  const ParallelDims& d = dist.dims;
  // Without tensor or pipeline parallelism the data-parallel group is the world, named as
  // before.
  const int dp = d.size(Dim::Dp), in_dp = d.coordinate(Dim::Dp);
  const bool split = dp < d.world();
  const std::string dp_name = split ? d.group_name(Dim::Dp) : "world";
  data_parallel_ = make(dist.data_parallel(GroupStream::Main), in_dp, dp, dp_name);
  if (d.size(Dim::Tp) > 1) {
    tensor_parallel_ = make(dist.group(Dim::Tp, GroupStream::Main), d.coordinate(Dim::Tp),
                            d.size(Dim::Tp), d.group_name(Dim::Tp));
  }
  if (d.size(Dim::Pp) > 1) {
    pipeline_parallel_ = make(dist.group(Dim::Pp, GroupStream::Main), d.coordinate(Dim::Pp),
                              d.size(Dim::Pp), d.group_name(Dim::Pp));
  }
  if (d.size(Dim::Ep) > 1) {  // a group of one rank (ep = dp) is a collective-free one
    const int in_edp = d.coordinate(Dim::Edp), edp = d.size(Dim::Edp);
    const std::string name = d.group_name(Dim::Edp);
    experts_ = make(dist.group(Dim::Edp, GroupStream::Main), in_edp, edp, name);
    expert_params_ = make(dist.group(Dim::Edp, GroupStream::Params), in_edp, edp, name + "/params");
    expert_touches_ =
        make(dist.group(Dim::Edp, GroupStream::Touch), in_edp, edp, name + "/touches");
  }
  if (d.splits(Dim::Hpz)) {
    hpz_ = make(dist.group(Dim::Hpz, GroupStream::Params), d.coordinate(Dim::Hpz), d.size(Dim::Hpz),
                d.group_name(Dim::Hpz));
  }
  if (d.size(Dim::DpShard) == dp) {
    const std::string prefix = split ? dp_name + "/" : "";
    params_ = make(dist.data_parallel(GroupStream::Params), in_dp, dp, prefix + "params");
    touches_ = make(dist.data_parallel(GroupStream::Touch), in_dp, dp, prefix + "touches");
    return;
  }
  const int size = d.size(Dim::DpShard), in_shard = d.coordinate(Dim::DpShard);
  const std::string shard = d.group_name(Dim::DpShard);
  group_ = make(dist.group(Dim::DpShard, GroupStream::Main), in_shard, size, shard);
  params_ = make(dist.group(Dim::DpShard, GroupStream::Params), in_shard, size, shard + "/params");
  touches_ = make(dist.group(Dim::DpShard, GroupStream::Touch), in_shard, size, shard + "/touches");
  replicas_ = make(dist.group(Dim::DpReplicate, GroupStream::Main), d.coordinate(Dim::DpReplicate),
                   d.size(Dim::DpReplicate), d.group_name(Dim::DpReplicate));
}

int64_t Communicators::bytes_sent() const {
  int64_t sent = 0;
  for (const auto* c :
       {&data_parallel_, &group_, &params_, &touches_, &replicas_, &hpz_, &tensor_parallel_,
        &pipeline_parallel_, &experts_, &expert_params_, &expert_touches_})
    if (*c) sent += (*c)->bytes_sent();
  return sent;
}

}  // namespace zeroshard
