#include "engine/EnginePlan.h"

#include <algorithm>

#include "engine/DeviceMemory.h"

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

}  // namespace

ModelSpec spec_of_groups(const std::vector<GroupShape>& groups, int64_t buffer_bytes) {
  ModelSpec spec;
  spec.source = "module";
  spec.model_type = "module";
  for (const GroupShape& g : groups) {
    spec.unit_params.push_back(g.numel);
    spec.unit_whole.push_back(!g.sharded);
    spec.unit_frozen.push_back(!g.trainable);
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
    s.sharded = g.sharded;
    s.trainable = g.trainable;
    shapes.push_back(s);
  }
  return shapes;
}

Plan plan_for(const std::vector<NamedParam>& params,
              const std::vector<std::vector<NamedParam>>& unit_params, int64_t buffer_bytes,
              const Config& config, const LaunchEnv& env, int64_t device_bytes) {
  HardwareBudget budget;
  budget.device_bytes = device_bytes;
  budget.host_bytes = host_memory_bytes();
  WorldShape world{env.world_size / std::max(1, env.local_world_size), env.local_world_size};
  if (world.ranks() != env.world_size) world = WorldShape{1, env.world_size};
  TrainingShape shape;
  shape.device_is_host = params.front().param.device().is_cpu();
  Plan plan = make_plan(spec_of_params(params, buffer_bytes), config, world, shape, budget);
  if (plan.settings.stage != 3) return plan;
  // The stage (and the bucket size that lays out parameters outside every unit) known:
  // planned again on the groups the engine will build.
  const auto layout = layout_groups(params, unit_params, 3, plan.settings.reduce_bucket_size);
  return make_plan(spec_of_groups(shapes_of(layout), buffer_bytes), config, world, shape, budget);
}

}  // namespace zeroshard
