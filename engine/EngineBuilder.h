#pragma once
// Assembles an engine (engine/EngineImpl.h) in the order its parts depend on each other:
// the plan (engine/EnginePlan.h) from the parameters and the launch, the process groups
// once the ranks agree on what they built (engine/RankAgreement.h), the flat groups with
// their optimizer (optim/MakeShardOptimizer.h) and gradient reducer, where offloaded state
// lives, and stage 3's unit schedule. The engine's constructors hand their arguments here,
// so the running engine holds no construction code. Callbacks the parts keep (the reducer's,
// the optimizer's) point at the engine, which outlives them; the builder is gone once the
// engine is built.
#include <memory>
#include <optional>
#include <vector>

#include "engine/EngineImpl.h"

namespace zeroshard {

class EngineBuilder {
 public:
  explicit EngineBuilder(EngineImpl& engine) : e_(&engine) {}

  // A torch::nn::Module: its stage-3 units found (engine/UnitPartition.h) or declared in
  // `options`, its buffers and tied names read from it.
  void build(std::shared_ptr<torch::nn::Module> module, const Config& config, EngineOptions options,
             std::optional<LaunchEnv> launch);
  // A parameter list (the Python package): EngineImpl's second constructor says what each is.
  void build(std::vector<NamedParam> params, std::vector<std::vector<NamedParam>> unit_params,
             const Config& config, std::optional<LaunchEnv> launch,
             std::vector<ParamGroup> param_groups, MaterializeParams materialize,
             std::vector<NamedBuffer> buffers, std::optional<AssumedBatch> batch);

 private:
  void init(std::vector<NamedParam> params, const std::vector<std::vector<NamedParam>>& unit_params,
            const Config& config, const std::optional<LaunchEnv>& launch,
            std::vector<ParamGroup> param_groups, const MaterializeParams& materialize,
            std::vector<NamedBuffer> buffers, const std::optional<AssumedBatch>& batch = {});
  void build_groups(const std::vector<NamedParam>& params,
                    const std::vector<std::vector<NamedParam>>& unit_params,
                    const MaterializeParams& materialize);
  void broadcast_initial_values(const std::vector<NamedParam>& params);
  // Which trainable parameter (numbered in layout order, the same on every rank) each
  // piece of the optimizer's group `t` holds: elements [begin, begin + count) of `g`.
  void add_param_pieces(const FlatParamGroup& g, size_t t, int64_t begin, int64_t count,
                        size_t& trained_params);
  // `on_host[i]`: the i-th trainable group's optimizer shard steps on the host (all of
  // them unless offload_optimizer.ratio keeps the first on the device).
  void make_optimizer(bool on_cpu, const std::vector<bool>& on_host);
  std::vector<bool> optimizer_on_host(const std::vector<GroupSpec>& layout) const;
  // offload_optimizer.overlap_step (optim/OverlappedStep.h), as the Planner resolved it.
  void make_overlapped_step(int threads);
  // Stage 3 with parameter offload: where each unit's shard lives (`on_nvme`, per
  // coordinator unit, from the plan's placement over `layout`), and for NVMe the ParamHome
  // the shards go to as build_groups makes them.
  std::unique_ptr<ParamHome> make_param_home(const std::vector<GroupSpec>& layout,
                                             std::vector<bool>& on_nvme);
  // The optimizer brings each NVMe shard in around its update.
  void hook_param_home(ParamHome* home);

  EngineImpl* const e_;  // the engine being built; callbacks capture it, never the builder
};

}  // namespace zeroshard
