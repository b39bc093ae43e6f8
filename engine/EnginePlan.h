#pragma once
// The plan an engine makes when it is built (plan/Planner.h on the parameters it holds),
// and the memory model's view of its flat groups. At stage 3 the plan counts the units
// the engine builds (engine/GroupLayout.h), each one of ModelSpec's units: a gather holds
// one unit, not the whole model, and offload_optimizer.ratio auto keeps on the device
// the optimizer of the first units that fit there, as the engine splits it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/Config.h"
#include "config/LaunchEnv.h"
#include "engine/GroupLayout.h"
#include "plan/ModelSpec.h"
#include "plan/Planner.h"

namespace zeroshard {

// One flat group as the memory model counts it.
struct GroupShape {
  int64_t numel = 0;
  bool sharded = false;     // stage 3: a unit's shard (else kept whole on every rank)
  bool trainable = true;    // has gradients and optimizer state
  int64_t quantizable = 0;  // elements weight_quantization would code (engine/QuantizedWeights.h)
  bool expert = false;      // experts' parameters, sharded over the edp ranks
};

// Each group one unit of the spec, in the engine's group order.
ModelSpec spec_of_groups(const std::vector<GroupShape>& groups, int64_t buffer_bytes);
std::vector<GroupShape> shapes_of(const std::vector<GroupSpec>& layout);

// The batch a plan made before any forward assumes for offload_optimizer.ratio auto, so
// that the device keeps room for the activations: the model's block shape
// (plan/HfConfig.h), its sequence length and whether layers are recomputed; the micro
// batch is the config's. The Python package assumes the model's longest sequence.
struct AssumedBatch {
  ModelSpec shaped;
  int64_t seq = 0;
  bool activation_checkpointing = false;
  std::string source;  // where seq came from, for the plan's reason
};

// `device_bytes`: what the plan budgets the model's device with (engine/DeviceMemory.h).
// `batch`: counted only where offload_optimizer.ratio is auto (none: the Planner's
// headroom is all the activations get).
Plan plan_for(const std::vector<NamedParam>& params,
              const std::vector<std::vector<NamedParam>>& unit_params, int64_t buffer_bytes,
              const Config& config, const LaunchEnv& env, int64_t device_bytes,
              const std::optional<AssumedBatch>& batch = std::nullopt);

}  // namespace zeroshard
