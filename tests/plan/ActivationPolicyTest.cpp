// activation_checkpointing.mode in the memory model: the blocks each policy recomputes and
// the bytes they keep, derived by hand from docs/memory-model.md for TinyLlama-1.1B's shape
// (h 2048, 32 heads of 64, 4 kv heads, I 5632, 22 layers, vocab 32000; bf16, 2048 tokens).
#include <gtest/gtest.h>

#include "plan/HfConfig.h"
#include "plan/MemoryModel.h"
#include "tests/plan/ToySpec.h"

using namespace zeroshard;

namespace {

ModelSpec tiny_llama() {
  return spec_from_arch(zeroshard::testing::tiny_llama_arch(), "llama", "test");
}

Config with_mode(const std::string& mode, const std::string& option = "",
                 std::optional<double> budget = std::nullopt) {
  Config c;
  c.bf16 = true;
  c.activation_checkpointing_mode = mode;
  c.selective_ac_option = option;
  c.activation_memory_budget = budget;
  return c;
}

// Per token: a block keeps 87,168 bytes (MemoryModelTest's Llama case), the head 2048 x 8 +
// 32000 x 6; a whole-recomputed block its bf16 input, 4,096.
constexpr int64_t kBlock = 87'168, kHead = 2048 * 8 + 32000 * 6, kInput = 4'096;

TrainingShape tokens_2048() {
  TrainingShape shape;
  shape.seq = 2048;
  return shape;
}

int64_t activations(const Config& c) {
  const TrainingShape shape = tokens_2048();
  const PlanOption stage3{3, OffloadDevice::None, OffloadDevice::None};
  return predict_memory(tiny_llama(), stage3, c, WorldShape{1, 8}, shape)
      .at(Tier::Device, Kind::Activations);
}

}  // namespace

TEST(ActivationPolicy, EachModeRecomputesTheBlocksItNames) {
  const ModelSpec s = tiny_llama();
  const TrainingShape shape = tokens_2048();
  auto layers = [&](const Config& c) {
    const Recomputed r = recomputed_layers(s, c, shape);
    return std::make_pair(r.whole, r.ops);
  };
  EXPECT_EQ(layers(with_mode("none")), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(layers(with_mode("full")), std::make_pair(int64_t{22}, int64_t{0}));
  EXPECT_EQ(layers(with_mode("selective", "4")), std::make_pair(int64_t{5}, int64_t{0}));
  EXPECT_EQ(layers(with_mode("selective")), std::make_pair(int64_t{0}, int64_t{22}));
  EXPECT_EQ(layers(with_mode("selective", "op")), std::make_pair(int64_t{0}, int64_t{22}));
  // memory_budget 0.5: none keeps 22 x 87,168 + 208,384 = 2,126,080 a token; n whole blocks
  // and one recomputed keep 2,213,248 - 83,072 n: n = 14 is the first within 1,063,040.
  EXPECT_EQ(layers(with_mode("memory_budget", "", 0.5)), std::make_pair(int64_t{14}, int64_t{0}));
  EXPECT_EQ(layers(with_mode("memory_budget")), std::make_pair(int64_t{14}, int64_t{0}));
  EXPECT_EQ(layers(with_mode("memory_budget", "", 1.0)), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(layers(with_mode("memory_budget", "", 0.0)), std::make_pair(int64_t{22}, int64_t{0}));
  TrainingShape served = shape;
  served.inference = true;
  EXPECT_EQ(recomputed_layers(s, with_mode("full"), served).whole, 0);
}

TEST(ActivationPolicy, EachModeKeepsWhatItsBlocksKeep) {
  const int64_t s = 2048;
  EXPECT_EQ(activations(with_mode("none")), s * (22 * kBlock + kHead));
  EXPECT_EQ(activations(with_mode("full")), s * (22 * kInput + kHead + kBlock));
  EXPECT_EQ(activations(with_mode("selective", "4")),
            s * (17 * kBlock + 5 * kInput + kHead + kBlock));
  // op: input and o_proj 2 x 2 x 2048, q 2 x 2048, k and v 2 x 2 x 256, the kernel's output
  // 2 x 2048 and log-sum-exp 4 x 32, gate and up 2 x 2 x 5632, down 2 x 2048: 44,160.
  EXPECT_EQ(activations(with_mode("selective", "op")), s * (22 * 44'160 + kHead + kBlock));
  EXPECT_EQ(activations(with_mode("memory_budget", "", 0.5)),
            s * (8 * kBlock + 14 * kInput + kHead + kBlock));
}

// activation_checkpointing.offload: every block's saved bytes on the offload tier, two
// blocks' on the device (the one whose backward runs, the one fetched ahead), and with
// NVMe two more in host RAM on their way.
TEST(ActivationPolicy, OffloadKeepsTwoBlocksOnTheDevice) {
  const int64_t s = 2048;
  const PlanOption stage3{3, OffloadDevice::None, OffloadDevice::None};
  auto tiers = [&](const std::string& mode, OffloadDevice device, const std::string& option = "") {
    Config c = with_mode(mode, option);
    c.activation_offload.device = device;
    if (device == OffloadDevice::Nvme) c.activation_offload.nvme_path = "/nvme";
    const MemoryBreakdown m =
        predict_memory(tiny_llama(), stage3, c, WorldShape{1, 8}, tokens_2048());
    return std::array<int64_t, 3>{m.at(Tier::Device, Kind::Activations),
                                  m.at(Tier::Host, Kind::Activations),
                                  m.at(Tier::Nvme, Kind::Activations)};
  };
  using T = std::array<int64_t, 3>;
  EXPECT_EQ(tiers("none", OffloadDevice::Cpu), (T{s * (kHead + 2 * kBlock), s * 22 * kBlock, 0}));
  EXPECT_EQ(tiers("none", OffloadDevice::Nvme),
            (T{s * (kHead + 2 * kBlock), s * 2 * kBlock, s * 22 * kBlock}));
  // full: the inputs leave; one block recomputed at a time, two inputs on the device.
  EXPECT_EQ(tiers("full", OffloadDevice::Cpu),
            (T{s * (kHead + kBlock + 2 * kInput), s * 22 * kInput, 0}));
  // selective 4: 17 blocks keep everything, 5 their input; the largest block decides the window.
  EXPECT_EQ(tiers("selective", OffloadDevice::Cpu, "4"),
            (T{s * (kHead + kBlock + 2 * kBlock), s * (17 * kBlock + 5 * kInput), 0}));
  TrainingShape served = tokens_2048();
  served.inference = true;
  Config c = with_mode("none");
  c.activation_offload.device = OffloadDevice::Cpu;
  EXPECT_EQ(predict_memory(tiny_llama(), stage3, c, WorldShape{1, 8}, served)
                .at(Tier::Host, Kind::Activations),
            0);  // served: nothing saved for backward
}
