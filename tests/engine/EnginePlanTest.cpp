// engine/EnginePlan: the plan an engine makes when it is built counts the groups it will
// build, so that offload_optimizer.ratio auto splits the optimizer unit by unit, as the
// Planner does from a model's units (tests/plan/PlannerTest.cpp).
#include "engine/EnginePlan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/Alignment.h"
#include "plan/HfConfig.h"
#include "plan/MemoryModel.h"
#include "plan/OptimizerSplit.h"

using namespace zeroshard;

namespace {

// Four stage-3 units, the first larger (as an embedding is), one frozen tensor in the
// second, and a tensor outside every unit (kept whole, its optimizer state sharded).
struct Model {
  explicit Model(c10::Device device = c10::kCPU) : device(device) {
    const std::vector<int64_t> sizes = {4000, 1500, 1500, 1500};
    for (size_t u = 0; u < sizes.size(); ++u) {
      units.emplace_back();
      add("unit" + std::to_string(u) + ".weight", sizes[u], true, &units.back());
    }
    add("unit1.frozen", 300, false, &units[1]);
    add("outside.scale", 16, true, nullptr);
  }
  void add(const std::string& name, int64_t numel, bool trainable, std::vector<NamedParam>* unit) {
    NamedParam p{name, torch::zeros({numel}, torch::device(device)).set_requires_grad(trainable)};
    params.push_back(p);
    if (unit) unit->push_back(p);
  }
  c10::Device device;
  std::vector<NamedParam> params;
  std::vector<std::vector<NamedParam>> units;
};

AssumedBatch llama_batch(int64_t seq) {
  AssumedBatch batch;
  batch.shaped = spec_from_hf_json(
      R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 8})",
      "config.json");
  batch.seq = seq;
  batch.source = "model.config.max_position_embeddings";
  return batch;
}

Config stage3_split_auto() {
  Config c;
  c.zero.stage = 3;
  c.zero.offload_optimizer.device = OffloadDevice::Cpu;
  c.zero.offload_optimizer.ratio.reset();  // auto
  return c;
}

// The shards' elements the engine splits (engine/EngineBuilder.cpp optimizer_on_host).
std::vector<int64_t> trainable_numels(const Model& m) {
  std::vector<int64_t> numels;
  for (const GroupSpec& g : layout_groups(m.params, m.units, ZeroStage(3), 500'000'000)) {
    if (!g.trainable) continue;
    int64_t n = 0;
    for (const auto& p : g.params) n += p.param.numel();
    numels.push_back(padded_shard_numel(n, 1));
  }
  return numels;
}

int64_t device_bytes_of(const Plan& p) {
  return p.predicted.total(Tier::Device);
}

}  // namespace

TEST(EnginePlan, RatioAutoKeepsOnTheDeviceTheFirstUnitsWhoseOptimizerFitsThere) {
  const Model m;
  const LaunchEnv one_rank;
  const std::vector<int64_t> numels = trainable_numels(m);
  ASSERT_EQ(numels.size(), 5u);  // the tensor outside the units, then the four units
  const auto kept_on_device = [&](double ratio) {
    const std::vector<bool> on_host = optimizer_on_host(numels, ratio);
    return static_cast<size_t>(std::count(on_host.begin(), on_host.end(), false));
  };
  for (size_t kept = 1; kept < numels.size(); ++kept) {
    SCOPED_TRACE("groups whose optimizer the device keeps: " + std::to_string(kept));
    // What the device holds with exactly `kept` groups there, from a fixed ratio.
    Config fixed = stage3_split_auto();
    fixed.zero.offload_optimizer.ratio = ratio_from(numels, kept);
    const int64_t needed =
        device_bytes_of(plan_for(m.params, m.units, 0, fixed, one_rank, int64_t{1} << 40));
    // The Planner uses 90% of the device: just enough for that, and one byte short.
    const auto device_for = [](int64_t bytes) { return (bytes * 10 + 8) / 9; };
    const Plan enough =
        plan_for(m.params, m.units, 0, stage3_split_auto(), one_rank, device_for(needed));
    ASSERT_TRUE(enough.fits) << enough.summary;
    EXPECT_EQ(kept_on_device(*enough.config.zero.offload_optimizer.ratio), kept);
    EXPECT_EQ(device_bytes_of(enough), needed);
    const Plan short_by_one =
        plan_for(m.params, m.units, 0, stage3_split_auto(), one_rank, device_for(needed) - 2);
    EXPECT_EQ(kept_on_device(*short_by_one.config.zero.offload_optimizer.ratio), kept - 1);
  }
}

// A stage-3 gather holds one unit (and what is prefetched), not the whole model: with a
// prefetch of 0 and no tensor small enough to stay whole, the gathered bytes are the
// largest unit's, in the compute dtype.
TEST(EnginePlan, Stage3GathersOneUnitAtATime) {
  const Model m;
  Config c;
  c.zero.stage = 3;
  c.bf16 = true;
  c.zero.stage3_prefetch_bucket_size = 0;
  c.zero.stage3_param_persistence_threshold = 0;
  const Plan p = plan_for(m.params, m.units, 0, c, LaunchEnv{}, int64_t{1} << 40);
  EXPECT_EQ(p.predicted.at(Tier::Device, Kind::GatheredParams), 2 * 4000);
}

// Before any forward, ratio auto leaves room on the device for the batch the Python
// package assumes (the model's longest sequence, the config's micro-batch): the units
// whose optimizer the device keeps are those that fit beside those activations, which
// are the activations of the whole model's plan (the other auto values as without them).
TEST(EnginePlan, RatioAutoLeavesRoomForTheAssumedBatchsActivations) {
  const Model m;
  const LaunchEnv one_rank;
  const std::vector<int64_t> numels = trainable_numels(m);
  const AssumedBatch batch = llama_batch(8);
  Config c = stage3_split_auto();
  c.train_micro_batch_size_per_gpu = 3;
  const int64_t huge = int64_t{1} << 40;
  const int64_t activations = plan_for(m.params, m.units, 0, c, one_rank, huge, batch)
                                  .predicted.at(Tier::Device, Kind::Activations);
  ASSERT_GT(activations, 0);
  const auto kept_on_device = [&](const Plan& p) {
    const std::vector<bool> on_host =
        optimizer_on_host(numels, *p.config.zero.offload_optimizer.ratio);
    return static_cast<size_t>(std::count(on_host.begin(), on_host.end(), false));
  };
  const auto device_for = [](int64_t bytes) { return (bytes * 10 + 8) / 9; };
  for (size_t kept = 1; kept < numels.size(); ++kept) {
    SCOPED_TRACE("groups whose optimizer the device keeps: " + std::to_string(kept));
    Config fixed = c;
    fixed.zero.offload_optimizer.ratio = ratio_from(numels, kept);
    const int64_t states = device_bytes_of(plan_for(m.params, m.units, 0, fixed, one_rank, huge));
    const Plan enough =
        plan_for(m.params, m.units, 0, c, one_rank, device_for(states + activations), batch);
    EXPECT_EQ(kept_on_device(enough), kept);
    EXPECT_EQ(device_bytes_of(enough), states + activations);
    EXPECT_EQ(enough.config.zero.reduce_bucket_size,
              plan_for(m.params, m.units, 0, c, one_rank, huge).config.zero.reduce_bucket_size);
    const Plan short_by_one =
        plan_for(m.params, m.units, 0, c, one_rank, device_for(states + activations) - 2, batch);
    EXPECT_EQ(kept_on_device(short_by_one), kept - 1);
    // Without the batch the same device keeps more, and the reason says the plan had none.
    const Plan blind =
        plan_for(m.params, m.units, 0, c, one_rank, device_for(states + activations));
    EXPECT_GT(kept_on_device(blind), kept);
    const std::string said = fmt::format("{}", fmt::join(blind.reasons, "\n"));
    EXPECT_NE(said.find("ratio: auto planned without activations"), std::string::npos) << said;
  }
  const Plan p = plan_for(m.params, m.units, 0, c, one_rank, huge, batch);
  const std::string said = fmt::format("{}", fmt::join(p.reasons, "\n"));
  EXPECT_NE(said.find("zero_optimization.offload_optimizer.ratio: auto planned with the "
                      "activations of micro-batches of 3 x 8 tokens "
                      "(model.config.max_position_embeddings)"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("zero_optimization.offload_optimizer.ratio: auto -> 0 "), std::string::npos)
      << said;
}

// overlap_step auto follows the ratio the batch leaves: planned without activations the
// whole optimizer fits on a GPU (ratio 0, nothing to overlap), with them none of it does
// (ratio 1), and then each shard steps on the host inside backward.
TEST(EnginePlan, OverlapStepAutoFollowsTheRatioTheAssumedBatchLeaves) {
  const Model m(c10::kMeta);  // not on the CPU: the device is a GPU's, not host RAM
  const LaunchEnv one_rank;
  const Config c = stage3_split_auto();
  const int64_t huge = int64_t{1} << 40;
  const AssumedBatch batch = llama_batch(4096);
  const Plan roomy = plan_for(m.params, m.units, 0, c, one_rank, huge);
  const int64_t device = roomy.predicted.total(Tier::Device) * 2;
  const Plan blind = plan_for(m.params, m.units, 0, c, one_rank, device);
  EXPECT_EQ(*blind.config.zero.offload_optimizer.ratio, 0.0);
  EXPECT_EQ(blind.config.zero.offload_optimizer.overlap_step, "false");
  const Plan seen = plan_for(m.params, m.units, 0, c, one_rank, device, batch);
  ASSERT_GT(seen.predicted.at(Tier::Device, Kind::Activations), device);
  EXPECT_EQ(*seen.config.zero.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(seen.config.zero.offload_optimizer.overlap_step, "true");
  const std::string said = fmt::format("{}", fmt::join(seen.reasons, "\n"));
  EXPECT_NE(said.find("overlap_step: auto -> true"), std::string::npos) << said;
  EXPECT_EQ(said.find("overlap_step: auto -> false"), std::string::npos) << said;
}
