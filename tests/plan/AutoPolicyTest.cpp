// activation_checkpointing.mode auto: the fewest blocks recomputed whole with which a
// choice fits, and the Planner's pick among the choices, for TinyLlama-1.1B's shape (as
// ActivationPolicyTest: 22 layers; bf16, 2048 tokens) on 8 ranks.
#include <gtest/gtest.h>

#include "plan/HfConfig.h"
#include "plan/Planner.h"
#include "tests/plan/ToySpec.h"

using namespace zeroshard;

namespace {

// Per token (ActivationPolicyTest): a block keeps 87,168 bytes, the head 208,384, a block
// recomputed whole its input, 4,096; backward recomputes one block at a time.
constexpr int64_t kBlock = 87'168, kHead = 2048 * 8 + 32000 * 6, kInput = 4'096, kSeq = 2048;
constexpr int64_t kLayers = 22;

ModelSpec tiny_llama() {
  return spec_from_arch(zeroshard::testing::tiny_llama_arch(), "llama", "test");
}

// Stage and offload left to the Planner.
Config auto_mode() {
  Config c;
  c.bf16 = true;
  c.zero.stage.reset();
  c.zero.offload_optimizer.device = OffloadDevice::Auto;
  c.zero.offload_param.device = OffloadDevice::Auto;
  c.activation_checkpointing_mode = "auto";
  return c;
}

TrainingShape tokens_2048(int64_t whole = 0) {
  TrainingShape shape;
  shape.seq = kSeq;
  shape.recomputed.whole = whole;
  return shape;
}

// The activations with k blocks recomputed whole, derived by hand.
int64_t activations(int64_t k) {
  if (k == 0) return kSeq * (kLayers * kBlock + kHead);
  return kSeq * ((kLayers - k) * kBlock + k * kInput + kHead + kBlock);
}

const PlanOption kStage3{3, OffloadDevice::None, OffloadDevice::None};
const WorldShape kWorld{1, 8};

HardwareBudget device_of(int64_t bytes) {
  HardwareBudget b;
  b.device_bytes = bytes;
  b.host_bytes = int64_t{1} << 40;
  b.headroom = 0;
  return b;
}

// Device bytes of stage 3 with k blocks recomputed: the model states (predicted with none,
// under the config as a plan resolves it, or `config`) and the hand-derived activations.
int64_t device_total(int64_t k, std::optional<Config> config = std::nullopt) {
  Config none = config ? *config
                       : make_plan(tiny_llama(), auto_mode(), kWorld, tokens_2048(),
                                   device_of(int64_t{1} << 50))
                             .config;
  none.activation_checkpointing_mode = "none";
  const MemoryBreakdown m = predict_memory(tiny_llama(), kStage3, none, kWorld, tokens_2048());
  return m.total(Tier::Device) - m.at(Tier::Device, Kind::Activations) + activations(k);
}

int64_t fewest(int64_t device_bytes) {
  return fewest_recomputed(tiny_llama(), kStage3, auto_mode(), kWorld, tokens_2048(),
                           device_of(device_bytes))
      .whole;
}

}  // namespace

TEST(AutoPolicy, RecomputesTheFewestBlocksThatFit) {
  // The mode's count is the shape's: what the planner chose.
  EXPECT_EQ(predict_memory(tiny_llama(), kStage3, auto_mode(), kWorld, tokens_2048(5))
                .at(Tier::Device, Kind::Activations),
            activations(5));
  const auto total = [](int64_t k) { return device_total(k, auto_mode()); };
  EXPECT_EQ(fewest(total(0)), 0);
  // One block recomputed keeps more than none (it comes back in backward beside the
  // others): a byte under none's total takes two, 2 x 83,072 per token saved > 87,168.
  EXPECT_EQ(fewest(total(0) - 1), 2);
  EXPECT_EQ(fewest(total(14)), 14);
  EXPECT_EQ(fewest(total(14) - 1), 15);
  EXPECT_EQ(fewest(total(kLayers)), kLayers);
  EXPECT_EQ(fewest(total(kLayers) - 1), kLayers);  // nothing fits: every block
  // Nothing to count (no model shape): none.
  ModelSpec shapeless = tiny_llama();
  shapeless.layers = 0;
  EXPECT_EQ(
      fewest_recomputed(shapeless, kStage3, auto_mode(), kWorld, tokens_2048(), device_of(1)).whole,
      0);
}

TEST(AutoPolicy, PlanKeepsEverythingOnTheDeviceRecomputingTheFewest) {
  const ModelSpec spec = tiny_llama();
  const Config c = auto_mode();
  // A device where stage 1 fits only recomputing blocks, stage 3 without: 2 GiB over what
  // stage 3 holds with none.
  const HardwareBudget budget = device_of(device_total(0) + (int64_t{2} << 30));
  const Plan plan = make_plan(spec, c, kWorld, tokens_2048(), budget);
  ASSERT_TRUE(plan.fits);
  const auto estimate = [&](int stage) {
    for (const auto& e : plan.options)
      if (e.option == PlanOption{stage, OffloadDevice::None, OffloadDevice::None}) return e;
    return OptionEstimate{};
  };
  EXPECT_FALSE(estimate(0).fits);
  ASSERT_TRUE(estimate(1).fits);
  EXPECT_GT(*estimate(1).recomputed, 0);
  EXPECT_EQ(*estimate(3).recomputed, 0);
  int best = 1;  // the fewest, the earliest where they tie
  for (int stage : {2, 3})
    if (*estimate(stage).recomputed < *estimate(best).recomputed) best = stage;
  EXPECT_EQ(plan.option.stage, best);
  EXPECT_EQ(plan.option.optimizer, OffloadDevice::None);
  EXPECT_NE(plan.summary.find("the one recomputing the fewest blocks"), std::string::npos)
      << plan.summary;
  bool said = false;
  for (const auto& r : plan.reasons)
    said |= r.find(fmt::format("activation_checkpointing.mode: auto -> {} of 22 blocks",
                               *estimate(best).recomputed)) == 0;
  EXPECT_TRUE(said);
  // The prediction is the chosen option's, with its blocks recomputed.
  EXPECT_EQ(plan.predicted.at(Tier::Device, Kind::Activations),
            activations(*estimate(best).recomputed));
}

TEST(AutoPolicy, OffloadsOnlyWhereNoDeviceChoiceFitsRecomputingEveryBlock) {
  const ModelSpec spec = tiny_llama();
  // Under stage 3's total with every block recomputed: nothing on the device fits.
  const HardwareBudget budget = device_of(device_total(kLayers) - 1);
  const Plan plan = make_plan(spec, auto_mode(), kWorld, tokens_2048(), budget);
  ASSERT_TRUE(plan.fits);
  EXPECT_NE(plan.option.optimizer, OffloadDevice::None);
  for (const auto& e : plan.options) {
    if (e.option == plan.option) {
      // The first offload that fits, with the fewest blocks it needs.
      EXPECT_EQ(
          *e.recomputed,
          fewest_recomputed(spec, e.option, plan.config, kWorld, tokens_2048(), budget).whole);
      break;
    }
    EXPECT_FALSE(e.fits) << e.option.label();  // before it in the order: none fits
    if (e.option.optimizer == OffloadDevice::None) {
      EXPECT_EQ(*e.recomputed, kLayers) << e.option.label();
    }
  }
}
