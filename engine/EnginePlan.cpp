#include "engine/EnginePlan.h"

#include <algorithm>

#include <fmt/format.h>

#include "engine/DeviceMemory.h"
#include "engine/QuantizedWeights.h"

namespace zeroshard {
namespace {

// Before the stage is known: the whole model as one unit.
ModelSpec spec_of_params(const std::vector<NamedParam>& params, int64_t buffer_bytes) {
  ModelSpec spec;
  spec.buffer_bytes = buffer_bytes;
  spec.source = "module";
  spec.model_type = "module";
  for (const auto& p : params) {
    spec.total_params += p.param.numel();
    spec.tensor_counts.push_back({p.param.numel(), 1});
  }
  spec.unit_params = {spec.total_params};
  spec.largest_module_params = spec.total_params;
  return spec;
}

// offload_optimizer.ratio auto again, with the batch's activations on the device, and
// overlap_step where it was auto (it steps every shard on the host, so it follows the
// ratio); every other value as `plan` resolved it (the batch's model shape would
// otherwise fill the bucket sizes from its hidden size, and ratio auto would change them).
Plan with_activations(const Plan& plan, const Config& config, ModelSpec spec,
                      const AssumedBatch& batch, const WorldShape& world, TrainingShape shape,
                      const HardwareBudget& budget) {
  const std::string keys[] = {"zero_optimization.offload_optimizer.ratio",
                              "zero_optimization.offload_optimizer.overlap_step"};
  const auto decided_again = [&keys](const std::string& reason) {
    return reason.rfind(keys[0], 0) == 0 || reason.rfind(keys[1], 0) == 0;
  };
  Config resolved = plan.config;
  resolved.zero.offload_optimizer.ratio.reset();
  resolved.zero.offload_optimizer.overlap_step = config.zero.offload_optimizer.overlap_step;
  take_shape(spec, batch.shaped);
  shape.seq = batch.seq;
  shape.micro_batch = resolved.train_micro_batch_size_per_gpu.value_or(1);
  shape.activation_checkpointing = batch.activation_checkpointing;
  Plan with = make_plan(spec, resolved, world, shape, budget);
  std::vector<std::string> reasons;
  for (const auto& r : plan.reasons)
    if (!decided_again(r)) reasons.push_back(r);
  for (const auto& r : with.reasons)
    if (decided_again(r)) reasons.push_back(r);
  with.reasons = std::move(reasons);
  return with;
}

std::string ratio_batch_reason(const AssumedBatch* batch, const Config& resolved) {
  const char* other =
      "for another batch, pass the ratio zeroshard-estimate --seq or "
      "zeroshard.estimate(model, config, seq=...) writes";
  if (!batch)
    return fmt::format(
        "zero_optimization.offload_optimizer.ratio: auto planned without "
        "activations (no model shape to count them from; only the device's "
        "headroom is left for them): {}",
        other);
  return fmt::format(
      "zero_optimization.offload_optimizer.ratio: auto planned with the "
      "activations of micro-batches of {} x {} tokens ({}{}): {}",
      resolved.train_micro_batch_size_per_gpu.value_or(1), batch->seq, batch->source,
      batch->activation_checkpointing ? ", layers recomputed in backward" : "", other);
}

}  // namespace

ModelSpec spec_of_groups(const std::vector<GroupShape>& groups, int64_t buffer_bytes) {
  ModelSpec spec;
  spec.source = "module";
  spec.model_type = "module";
  for (const GroupShape& g : groups) {
    spec.unit_params.push_back(g.numel);
    spec.unit_whole.push_back(!g.sharded);
    spec.unit_frozen.push_back(!g.trainable);
    spec.unit_quantizable.push_back(g.quantizable);
    spec.unit_expert.push_back(g.expert);
    spec.total_params += g.numel;
  }
  spec.buffer_bytes = buffer_bytes;
  spec.largest_module_params = spec.largest_unit();
  return spec;
}

std::vector<GroupShape> shapes_of(const std::vector<GroupSpec>& layout) {
  std::vector<GroupShape> shapes;
  for (const GroupSpec& g : layout) {
    GroupShape s;
    for (const auto& p : g.params) s.numel += p.param.numel();
    s.quantizable = quantized_numel(g.params);
    s.sharded = g.sharded;
    s.trainable = g.trainable;
    s.expert = g.expert;
    shapes.push_back(s);
  }
  return shapes;
}

Plan plan_for(const std::vector<NamedParam>& params,
              const std::vector<std::vector<NamedParam>>& unit_params, int64_t buffer_bytes,
              const Config& config, const LaunchEnv& env, int64_t device_bytes,
              const std::optional<AssumedBatch>& batch) {
  HardwareBudget budget;
  budget.device_bytes = device_bytes;
  budget.host_bytes = host_memory_bytes();
  // With tensor parallelism the parameters given are this rank's slices, sharded over the
  // world / tp data-parallel ranks (WorldShape::data_parallel_ranks).
  // With pipeline stages, one stage's ranks (the outermost dimension): the parameters given
  // are the stage's, sharded over its data-parallel ranks.
  const int64_t tp = std::max<int64_t>(1, config.tensor_parallel_size.value_or(1));
  const int64_t pp = std::max<int64_t>(1, config.pipeline_parallel_size.value_or(1));
  const int64_t ranks = env.world_size / pp;
  const int64_t per_node = std::min<int64_t>(std::max(1, env.local_world_size), ranks);
  WorldShape world{ranks / per_node, per_node, tp};
  if (world.ranks() != ranks || per_node % tp != 0) world = {1, ranks, tp};
  TrainingShape shape;
  shape.device_is_host = params.front().param.device().is_cpu();
  ModelSpec spec = spec_of_params(params, buffer_bytes);
  Plan plan = make_plan(spec, config, world, shape, budget);
  const int64_t ep = config.expert_parallel_size;
  if (plan.settings.stage.shards_parameters() || ep > 1) {
    // The stage (and the bucket size that lays out parameters outside every unit) known:
    // planned again on the groups the engine will build; experts' groups shard over the
    // ranks holding the same experts.
    const auto layout =
        layout_groups(params, unit_params, plan.settings.stage, plan.settings.reduce_bucket_size);
    spec = spec_of_groups(shapes_of(layout), buffer_bytes);
    spec.expert_parallel = ep;
    plan = make_plan(spec, config, world, shape, budget);
  }
  if (config.zero.offload_optimizer.ratio) return plan;  // a fixed ratio: nothing to fill
  const bool counted = batch && batch->seq > 0;
  if (counted) plan = with_activations(plan, config, spec, *batch, world, shape, budget);
  if (plan.option.optimizer != OffloadDevice::None)
    plan.reasons.push_back(ratio_batch_reason(counted ? &*batch : nullptr, plan.config));
  return plan;
}

}  // namespace zeroshard
