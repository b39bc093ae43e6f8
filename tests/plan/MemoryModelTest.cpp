// Every figure here is derived by hand from docs/memory-model.md, not from the code.
#include "plan/MemoryModel.h"

#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "plan/HfConfig.h"
#include "plan/OptimizerSplit.h"
#include "tests/common/TestPaths.h"
#include "tests/plan/ToySpec.h"

using namespace zeroshard;
using OD = OffloadDevice;
using zeroshard::testing::toy_spec;

namespace {

// Two units of 3,200 parameters: with 2 ranks each shard is 1,600 elements, already a
// multiple of the 64-element alignment, so the numbers below stay round.
Config toy_config(bool bf16) {
  Config c;
  c.bf16 = bf16;
  c.zero.reduce_bucket_size = 1000;
  c.zero.allgather_bucket_size = 500;
  c.zero.stage3_prefetch_bucket_size = 100;
  c.zero.stage3_max_live_parameters = 5000;
  c.zero.stage3_param_persistence_threshold = 10;
  c.zero.sub_group_size = 800;
  c.zero.offload_optimizer.buffer_count = 4;
  c.zero.offload_param.buffer_count = 5;
  return c;
}

// torch.optim.SGD with momentum named in the config: 4 bytes of state an element.
Config sgd_momentum_config() {
  Config c = toy_config(true);
  c.optimizer = load_config_string(R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})",
                                   "ds.json")
                    .config.optimizer;
  return c;
}

MemoryBreakdown predict(const PlanOption& o, bool bf16 = true, bool overlap = false) {
  Config c = toy_config(bf16);
  c.zero.overlap_comm = overlap;
  return predict_memory(toy_spec(), o, c, WorldShape{1, 2}, TrainingShape{});
}

}  // namespace

TEST(MemoryModel, Stage0Bf16HoldsEverythingOnDevice) {
  const auto m = predict({0, OD::None, OD::None});
  EXPECT_EQ(m.at(Tier::Device, Kind::Params), 2 * 6400);
  EXPECT_EQ(m.at(Tier::Device, Kind::MasterParams), 4 * 6400);
  EXPECT_EQ(m.at(Tier::Device, Kind::OptimizerStates), 8 * 6400);
  EXPECT_EQ(m.at(Tier::Device, Kind::Grads), 2 * 6400);
  EXPECT_EQ(m.at(Tier::Device, Kind::GradsFp32), 4 * 6400);
  EXPECT_EQ(m.at(Tier::Device, Kind::CommBuckets), 2 * 1000);
  EXPECT_EQ(m.total(Tier::Device), 130'000);
  EXPECT_EQ(m.total(Tier::Host), 0);
  EXPECT_EQ(m.total(Tier::Nvme), 0);
}

TEST(MemoryModel, BuffersAreWholeOnTheDeviceAtEveryStageAndOffload) {
  ModelSpec spec = toy_spec();
  spec.buffer_bytes = 1234;
  const Config c = toy_config(true);
  for (const PlanOption& o :
       {PlanOption{0, OD::None, OD::None}, PlanOption{3, OD::Cpu, OD::Nvme}}) {
    const auto with = predict_memory(spec, o, c, WorldShape{1, 2}, TrainingShape{});
    const auto without = predict_memory(toy_spec(), o, c, WorldShape{1, 2}, TrainingShape{});
    EXPECT_EQ(with.at(Tier::Device, Kind::Buffers), 1234);
    EXPECT_EQ(with.total(Tier::Device), without.total(Tier::Device) + 1234);
    EXPECT_EQ(with.total(Tier::Host), without.total(Tier::Host));
  }
}

TEST(MemoryModel, OverlapCommDoublesTheReduceBucket) {
  EXPECT_EQ(predict({0, OD::None, OD::None}, true, true).at(Tier::Device, Kind::CommBuckets), 4000);
}

// Reduced in another dtype (communication_data_type), a bucket in flight holds a copy cast
// to it and the receive buffer in it: 2 x 4 x 1,000 for bf16 gradients reduced in fp32;
// 2 x 2 x 1,000 for fp32 ones in bf16; in their own dtype, the receive buffer alone.
TEST(MemoryModel, ReducingInAnotherDtypeHoldsTheCastCopyToo) {
  Config c = toy_config(true);
  const auto bucket = [&](const char* wire, bool bf16) {
    c.bf16 = bf16;
    c.communication_data_type = wire;
    return predict_memory(toy_spec(), {0, OD::None, OD::None}, c, WorldShape{1, 2}, TrainingShape{})
        .at(Tier::Device, Kind::CommBuckets);
  };
  EXPECT_EQ(bucket("fp32", true), 8000);
  EXPECT_EQ(bucket("bf16", false), 4000);
  EXPECT_EQ(bucket("bf16", true), 2000);
  EXPECT_EQ(bucket("", true), 2000);
  EXPECT_EQ(bucket("fp32", false), 4000);
}

TEST(MemoryModel, Stage1ShardsOptimizerState) {
  const auto m = predict({1, OD::None, OD::None});
  EXPECT_EQ(m.at(Tier::Device, Kind::MasterParams), 4 * 3200);
  EXPECT_EQ(m.at(Tier::Device, Kind::OptimizerStates), 8 * 3200);
  EXPECT_EQ(m.at(Tier::Device, Kind::Grads), 2 * 6400);
  EXPECT_EQ(m.at(Tier::Device, Kind::CommBuckets), 2 * 1000 + 2 * 500);
  EXPECT_EQ(m.total(Tier::Device), 79'800);
}

// Stage 2 reduces buckets inside backward: only the fp32 shard accumulator stays.
TEST(MemoryModel, Stage2ShardsGradients) {
  const auto m = predict({2, OD::None, OD::None});
  EXPECT_EQ(m.at(Tier::Device, Kind::Grads), 0);
  EXPECT_EQ(m.at(Tier::Device, Kind::GradsFp32), 4 * 3200);
  EXPECT_EQ(m.total(Tier::Device), 67'000);
  // fp32 training keeps the same accumulator.
  EXPECT_EQ(predict({2, OD::None, OD::None}, false).at(Tier::Device, Kind::GradsFp32), 4 * 3200);
}

TEST(MemoryModel, Stage3ShardsParamsAndHoldsGatheredUnits) {
  const auto m = predict({3, OD::None, OD::None});
  EXPECT_EQ(m.at(Tier::Device, Kind::Params), 2 * 3200);
  // One unit (3,200) plus the 100-element prefetch bucket, under the live limit of 5,000.
  EXPECT_EQ(m.at(Tier::Device, Kind::GatheredParams), 2 * 3300);
  EXPECT_EQ(m.at(Tier::Device, Kind::CommBuckets), 2 * 1000);
  EXPECT_EQ(m.total(Tier::Device), 66'200);
}

TEST(MemoryModel, Stage3KeepsWholeUnitsWhole) {
  ModelSpec s = toy_spec();
  s.unit_whole = {false, true};  // the second unit stays whole: +1,600 elements per rank
  const auto m = predict_memory(s, {3, OD::None, OD::None}, toy_config(true), WorldShape{1, 2},
                                TrainingShape{});
  EXPECT_EQ(m.at(Tier::Device, Kind::Params), 2 * (3200 + 1600));
  EXPECT_EQ(m.at(Tier::Device, Kind::OptimizerStates), 8 * 3200);  // still sharded
}

// A frozen unit (a LoRA model's base) has parameters, but neither gradients nor
// optimizer state: every stage holds its parameters and nothing else of it.
TEST(MemoryModel, FrozenUnitsHoldOnlyTheirParameters) {
  ModelSpec s = toy_spec();
  s.unit_frozen = {false, true};
  for (int stage : {0, 1, 2, 3}) {
    const auto m = predict_memory(s, {stage, OD::None, OD::None}, toy_config(true),
                                  WorldShape{1, 2}, TrainingShape{});
    const int64_t optimizer_owns = stage >= 1 ? 1600 : 3200;  // the trainable unit's
    EXPECT_EQ(m.at(Tier::Device, Kind::Params), 2 * (stage == 3 ? 3200 : 6400)) << stage;
    EXPECT_EQ(m.at(Tier::Device, Kind::MasterParams), 4 * optimizer_owns) << stage;
    EXPECT_EQ(m.at(Tier::Device, Kind::OptimizerStates), 8 * optimizer_owns) << stage;
    EXPECT_EQ(m.at(Tier::Device, Kind::Grads), stage >= 2 ? 0 : 2 * 3200) << stage;
    EXPECT_EQ(m.at(Tier::Device, Kind::GradsFp32), 4 * optimizer_owns) << stage;
  }
}

TEST(MemoryModel, Stage2CpuOffloadMovesOptimizerAndFp32GradsToHost) {
  const auto m = predict({2, OD::Cpu, OD::None});
  EXPECT_EQ(m.total(Tier::Device), 2 * 6400 + 0 + 3000);
  EXPECT_EQ(m.at(Tier::Host, Kind::MasterParams), 4 * 3200);
  EXPECT_EQ(m.at(Tier::Host, Kind::OptimizerStates), 8 * 3200);
  EXPECT_EQ(m.at(Tier::Host, Kind::GradsFp32), 4 * 3200);
  // The updated shards' staging: two slots of a unit's 1,600-element bf16 shard (3,200
  // bytes, aligned to 4,096).
  EXPECT_EQ(m.at(Tier::Host, Kind::PinnedBuffers), 2 * 4096);
  EXPECT_EQ(m.total(Tier::Host), 4 * 3200 + 8 * 3200 + 4 * 3200 + 2 * 4096);
}

TEST(MemoryModel, Stage3NvmeEverything) {
  Config c = toy_config(true);
  c.zero.offload_param.max_in_cpu = 0;  // no shard kept in host RAM
  const auto m =
      predict_memory(toy_spec(), {3, OD::Nvme, OD::Nvme}, c, WorldShape{1, 2}, TrainingShape{});
  // Gathered 3,300 (a unit and the prefetch), one unit's 1,600-element shard while it is cut
  // on the device at construction, reduce buckets 2,000.
  EXPECT_EQ(m.total(Tier::Device), 2 * (3300 + 1600) + 2000);
  // Each unit's 1,600-element bf16 shard is a swap region aligned to 4,096 bytes.
  EXPECT_EQ(m.total(Tier::Nvme), 2 * 4096 + 4 * 3200 + 8 * 3200);
  // Staging of the updated shards: 2 slots of an 800-element sub-group x 2 (1,600 bytes,
  // aligned to 4,096); 4 swap slots of 800 x 12 (9,600 bytes, aligned to 12,288); 5 param
  // buffers of a 1,600 shard x 2 (3,200 bytes, aligned to 4,096).
  EXPECT_EQ(m.at(Tier::Host, Kind::PinnedBuffers), 2 * 4096 + 4 * 12'288 + 5 * 4096);
  // Host: fp32 gradients 4 x 3,200, the staging, and the two trainable 1,600-element bf16
  // shards waiting at construction for the optimizer to read them before they go to NVMe.
  EXPECT_EQ(m.total(Tier::Host), 4 * 3200 + 2 * 4096 + 4 * 12'288 + 5 * 4096 + 2 * 3200);
  // With the device in host RAM they wait there, where the cut shard was.
  TrainingShape on_host;
  on_host.device_is_host = true;
  const auto cpu =
      predict_memory(toy_spec(), {3, OD::Nvme, OD::Nvme}, c, WorldShape{1, 2}, on_host);
  EXPECT_EQ(cpu.at(Tier::Device, Kind::Params), 2 * 3200);
  EXPECT_EQ(cpu.at(Tier::Host, Kind::Params), 0);
}

TEST(MemoryModel, Fp32TrainingNeedsNoMasterCopy) {
  const auto m = predict({0, OD::None, OD::None}, false);
  EXPECT_EQ(m.at(Tier::Device, Kind::MasterParams), 0);
  EXPECT_EQ(m.at(Tier::Device, Kind::GradsFp32), 0);
  EXPECT_EQ(m.total(Tier::Device), 4 * 6400 + 8 * 6400 + 4 * 6400 + 4 * 1000);
}

TEST(MemoryModel, ActivationsOfAGptBlockAreKorthikantisWithoutDropout) {
  ModelSpec s = toy_spec();
  s.layers = 2;
  s.hidden = 8;
  s.heads = 2;
  s.vocab = 10;
  // s=4, b=3, k_l=2, per token: two LayerNorms 2*(2*2*8) = 64; q, k, v, output 2*4*8 = 64;
  // eager scores (2+4)*a*s = 48; MLP (4h) 2*2*32 = 128: 304, Korthikanti's 34h + 5as = 312
  // less his two dropout masks (2h) and with the softmax kept in fp32 (6as for his 5as).
  // The head: final norm 32 + logits 10*(2+4) = 92 per token.
  EXPECT_EQ(activation_bytes(s, TrainingShape{4, 3, false}, 2), 2 * 12 * 304 + 12 * 92);
  // Checkpointed: each block's input s*b*h*k_l, plus one block and the head.
  EXPECT_EQ(activation_bytes(s, TrainingShape{4, 3, true}, 2), 2 * 192 + 12 * 304 + 12 * 92);
  EXPECT_EQ(activation_bytes(toy_spec(), TrainingShape{4, 3, false}, 2), 0);
}

// TinyLlama-1.1B's block, bf16, sdpa: per token 2 RMSNorms of (4 + 2*2)*2048 = 32,768;
// q and output 2*2*2048 and k, v 2*2*256 (4 of 32 heads) = 9,216; the log-sum-exp 4*32;
// the gated MLP 4*2*5632 = 45,056. 87,168 bytes: 42.56*h, what torch's saved-tensor hooks
// count for transformers' LlamaDecoderLayer (tests/python/test_activation_memory.py).
TEST(MemoryModel, ActivationsOfALlamaBlockWithFusedAttention) {
  const TransformerArch a = zeroshard::testing::tiny_llama_arch();
  const ModelSpec s = spec_from_arch(a, "llama", "test");
  const int64_t head = 2048 * 8 + 32000 * 6;
  EXPECT_EQ(activation_bytes(s, TrainingShape{2048, 1, false}, 2), 2048 * (22 * 87'168 + head));
  // Eager: keys and values repeated to all 32 heads and the output copied for o_proj
  // (2*4*2048 for the fused kernel's 9,344), and the fp32 softmax with its bf16 copy 6*a*s.
  TransformerArch eager = a;
  eager.eager_attention = true;
  EXPECT_EQ(
      activation_bytes(spec_from_arch(eager, "llama", "test"), TrainingShape{2048, 1, false}, 2),
      2048 * (22 * (87'168 - 9'344 + 2 * 4 * 2048 + 6 * 32 * 2048) + head));
}

// The seed formula (docs/memory-model.md) for Llama-2-7b, stage 3, 8 ranks, bf16:
// M_m = 2p/8, M_o = 12p/8; gradients live as the fp32 shard 4p/8 (M_g with k = 4). Shards are
// padded per unit, so each term may exceed p/8 by at most 64 elements per unit.
TEST(MemoryModel, MatchesTheSeedFormulaForLlama7b) {
  const ModelSpec s = spec_from_hf_file(std::string(zeroshard::testing::source_dir()) +
                                        "/tests/data/hf/llama2_7b.json");
  Config c = toy_config(true);
  const auto m = predict_memory(s, {3, OD::None, OD::None}, c, WorldShape{1, 8}, TrainingShape{});
  const int64_t p = s.total_params;
  const int64_t slack = 33 * 64;
  auto near = [&](int64_t got, int64_t bytes_per_param) {
    EXPECT_GE(got, bytes_per_param * p / 8);
    EXPECT_LE(got, bytes_per_param * (p / 8 + slack));
  };
  near(m.at(Tier::Device, Kind::Params), 2);
  near(m.at(Tier::Device, Kind::MasterParams) + m.at(Tier::Device, Kind::OptimizerStates), 12);
  EXPECT_EQ(m.at(Tier::Device, Kind::Grads), 0);
  near(m.at(Tier::Device, Kind::GradsFp32), 4);
}

TEST(MemoryModel, Stage3ParamOffloadKeepsShardsInHostUpToMaxInCpuAndTheRestOnNvme) {
  ModelSpec s = toy_spec();
  s.unit_params = {3200, 3200, 3200, 640};
  s.unit_whole = {false, false, false, true};  // whole units stay on the device
  s.total_params = 10240;
  Config c = toy_config(true);
  c.zero.offload_param.max_in_cpu = 1700;  // one 1,600-element shard (d = 2) fits, not two
  const auto m = predict_memory(s, {3, OD::Nvme, OD::Nvme}, c, WorldShape{1, 2}, TrainingShape{});
  // The whole unit, and the largest offloaded shard while construction cuts it.
  EXPECT_EQ(m.at(Tier::Device, Kind::Params), 2 * (640 + 1600));
  // One shard kept by max_in_cpu, and the two bound for NVMe waiting at construction.
  EXPECT_EQ(m.at(Tier::Host, Kind::Params), 2 * (1600 + 2 * 1600));
  EXPECT_EQ(m.at(Tier::Nvme, Kind::Params), 2 * 4096);  // two 3,200-byte regions, aligned
  const auto placed =
      place_param_shards(s, OD::Nvme, c.zero.offload_param.max_in_cpu.value_or(0), 2);
  EXPECT_EQ(placed.in_host, std::vector<size_t>{0});
  EXPECT_EQ(placed.largest_nvme_shard, 1600);
  const auto cpu = predict_memory(s, {3, OD::Cpu, OD::Cpu}, c, WorldShape{1, 2}, TrainingShape{});
  EXPECT_EQ(cpu.at(Tier::Host, Kind::Params), 2 * 4800);
  EXPECT_EQ(cpu.at(Tier::Nvme, Kind::Params), 0);
}

// MiCS: 4 ranks in groups of 2 hold what 2 ranks sharding everything hold (1,600 per
// unit and rank), twice what 4 ranks sharding everything hold (832 per unit: 800
// padded to the 64-element alignment).
TEST(MemoryModel, MicsShardsInsideEachGroup) {
  Config c = toy_config(true);
  c.zero.mics_shard_size = 2;
  const auto grouped =
      predict_memory(toy_spec(), {3, OD::None, OD::None}, c, WorldShape{2, 2}, TrainingShape{});
  EXPECT_EQ(grouped.at(Tier::Device, Kind::Params), 2 * 3200);
  EXPECT_EQ(grouped.at(Tier::Device, Kind::MasterParams), 4 * 3200);
  EXPECT_EQ(grouped.at(Tier::Device, Kind::OptimizerStates), 8 * 3200);
  EXPECT_EQ(grouped.at(Tier::Device, Kind::GradsFp32), 4 * 3200);
  EXPECT_EQ(grouped.total(Tier::Device), 66'200);  // as Stage3ShardsParamsAndHoldsGatheredUnits
  c.zero.mics_shard_size = -1;
  const auto everywhere =
      predict_memory(toy_spec(), {3, OD::None, OD::None}, c, WorldShape{2, 2}, TrainingShape{});
  EXPECT_EQ(everywhere.at(Tier::Device, Kind::OptimizerStates), 8 * 2 * 832);
  // Stage 0 shards nothing, with or without groups: every rank holds both units, each
  // padded to 4 shards of 832.
  c.zero.mics_shard_size = 2;
  EXPECT_EQ(
      predict_memory(toy_spec(), {0, OD::None, OD::None}, c, WorldShape{2, 2}, TrainingShape{})
          .at(Tier::Device, Kind::OptimizerStates),
      8 * 2 * 4 * 832);
}

// hpZ on 2 nodes x 2 ranks, groups of 2: each unit of 3,200 is padded to 4 shards of 832
// (3,328) and each rank keeps half of it, in compute precision (bf16). Whole units and
// units at or below the persistence threshold are never freed, so no copy; parameter
// offload and stages below 3 have none.
TEST(MemoryModel, HpzKeepsHalfOfEveryFreedUnitPerRank) {
  Config c = toy_config(true);
  c.zero.hpz_partition_size = 2;
  const WorldShape world{2, 2};
  const auto m = predict_memory(toy_spec(), {3, OD::None, OD::None}, c, world, TrainingShape{});
  EXPECT_EQ(m.at(Tier::Device, Kind::SecondaryParams), 2 * 2 * 3328 / 2);
  c.zero.hpz_partition_size = 1;
  const auto without = predict_memory(toy_spec(), {3, OD::None, OD::None}, c, world, {});
  EXPECT_EQ(m.total(Tier::Device) - without.total(Tier::Device), 2 * 3328);
  c.zero.hpz_partition_size = 2;
  ModelSpec one_whole = toy_spec();
  one_whole.unit_whole = {false, true};
  EXPECT_EQ(predict_memory(one_whole, {3, OD::None, OD::None}, c, world, {})
                .at(Tier::Device, Kind::SecondaryParams),
            2 * 3328 / 2);
  c.zero.stage3_param_persistence_threshold = 3200;
  EXPECT_EQ(predict_memory(toy_spec(), {3, OD::None, OD::None}, c, world, {})
                .at(Tier::Device, Kind::SecondaryParams),
            0);
  c.zero.stage3_param_persistence_threshold = 10;
  for (const PlanOption& o : {PlanOption{3, OD::Cpu, OD::Cpu}, PlanOption{2, OD::None, OD::None}})
    EXPECT_EQ(predict_memory(toy_spec(), o, c, world, {}).at(Tier::Device, Kind::SecondaryParams),
              0)
        << o.label();
}

// A torch.optim class's state is what it keeps per element: SGD with momentum one fp32
// array (a third of Adam's 12 bytes with the master), beside the same fp32 master.
TEST(MemoryModel, OptimizerStateIsTheOptimizersOwn) {
  Config c = sgd_momentum_config();
  const auto m =
      predict_memory(toy_spec(), {2, OD::Cpu, OD::None}, c, WorldShape{1, 2}, TrainingShape{});
  EXPECT_EQ(m.at(Tier::Host, Kind::OptimizerStates), 4 * 3200);
  EXPECT_EQ(m.at(Tier::Host, Kind::MasterParams), 4 * 3200);
  const auto adam = predict({2, OD::Cpu, OD::None});
  EXPECT_EQ(adam.at(Tier::Host, Kind::OptimizerStates), 8 * 3200);
  // Adafactor with beta1: exp_avg per element, row and column statistics whole on every
  // rank, the vectors' exp_avg_sq sharded over the 2 ranks.
  c.optimizer.state_whole_bytes = 1000;
  c.optimizer.state_sharded_bytes = 640;
  const auto adafactor =
      predict_memory(toy_spec(), {2, OD::Cpu, OD::None}, c, WorldShape{1, 2}, TrainingShape{});
  EXPECT_EQ(adafactor.at(Tier::Host, Kind::OptimizerStates), 4 * 3200 + 1000 + 320);
}

TEST(MemoryModel, ATorchOptimizerPagesOnlyItsStateThroughNvme) {
  const auto m = predict_memory(toy_spec(), {2, OD::Nvme, OD::None}, sgd_momentum_config(),
                                WorldShape{1, 2}, TrainingShape{});
  // The momentum buffer (4 bytes an element) on NVMe; the fp32 master stays in host RAM.
  EXPECT_EQ(m.at(Tier::Nvme, Kind::OptimizerStates), 4 * 3200);
  EXPECT_EQ(m.at(Tier::Nvme, Kind::MasterParams), 0);
  EXPECT_EQ(m.at(Tier::Host, Kind::MasterParams), 4 * 3200);
  // 4 swap slots of an 800-element sub-group x 4 bytes (3,200, aligned to 4,096); no
  // staging: the Python package's class writes the shards back itself.
  EXPECT_EQ(m.at(Tier::Host, Kind::PinnedBuffers), 4 * 4096);
}

// offload_optimizer.ratio: the last shards (by elements) step on the host, the first keep
// master, Adam state and fp32 gradient on the device; rounded up to a whole shard there.
TEST(OptimizerSplit, TheLastShardsGoToTheHostAsDeepSpeedsSubGroupsDo) {
  const std::vector<int64_t> shards{100, 300, 100, 500};  // 1,000 elements
  using V = std::vector<bool>;
  EXPECT_EQ(optimizer_on_host(shards, 1.0), (V{true, true, true, true}));
  EXPECT_EQ(optimizer_on_host(shards, 0.0), (V{false, false, false, false}));
  // (1 - ratio) x 1,000 elements kept on the device, up to the end of the shard it ends in.
  EXPECT_EQ(optimizer_on_host(shards, 0.5), (V{false, false, false, true}));   // 500
  EXPECT_EQ(optimizer_on_host(shards, 0.6), (V{false, false, true, true}));    // 400
  EXPECT_EQ(optimizer_on_host(shards, 0.55), (V{false, false, false, true}));  // 450: 500
  EXPECT_EQ(optimizer_on_host(shards, 0.95), (V{false, true, true, true}));    // 50: 100
  // ratio_from is its inverse, also through its shortest decimal text.
  for (size_t first = 0; first <= shards.size(); ++first) {
    const double ratio = ratio_from(shards, first);
    const double reread = std::stod(fmt::format("{}", ratio));
    for (double r : {ratio, reread}) {
      const V on_host = optimizer_on_host(shards, r);
      for (size_t i = 0; i < shards.size(); ++i) EXPECT_EQ(on_host[i], i >= first) << r;
    }
  }
  EXPECT_EQ(ratio_from(shards, 2), 0.6);
}

// Stage 3, optimizer on the host, ratio 0.5: of the toy's two 1,600-element shards per
// rank the first keeps 16 bytes an element on the device (fp32 master 4, m and v 8, fp32
// gradient 4) and the host holds the other's; 0.3 rounds up to both on the device.
TEST(MemoryModel, OffloadRatioKeepsTheFirstShardsOptimizerOnTheDevice) {
  Config c = toy_config(true);
  const PlanOption o{3, OD::Cpu, OD::None};
  const auto all = predict_memory(toy_spec(), o, c, WorldShape{1, 2}, TrainingShape{});
  c.zero.offload_optimizer.ratio = 0.5;
  const auto half = predict_memory(toy_spec(), o, c, WorldShape{1, 2}, TrainingShape{});
  for (Kind k : {Kind::MasterParams, Kind::GradsFp32}) {
    EXPECT_EQ(half.at(Tier::Device, k), 4 * 1600);
    EXPECT_EQ(half.at(Tier::Host, k), 4 * 1600);
  }
  EXPECT_EQ(half.at(Tier::Device, Kind::OptimizerStates), 8 * 1600);
  EXPECT_EQ(half.at(Tier::Host, Kind::OptimizerStates), 8 * 1600);
  EXPECT_EQ(half.total(Tier::Device) - all.total(Tier::Device), 16 * 1600);
  EXPECT_EQ(all.total(Tier::Host) - half.total(Tier::Host), 16 * 1600);
  c.zero.offload_optimizer.ratio = 0.3;
  const auto most = predict_memory(toy_spec(), o, c, WorldShape{1, 2}, TrainingShape{});
  EXPECT_EQ(most.at(Tier::Device, Kind::OptimizerStates), 8 * 3200);
  EXPECT_EQ(most.at(Tier::Host, Kind::OptimizerStates), 0);
  // Only stage 3 with the optimizer on the host splits (the Config refuses the rest).
  const auto stage2 =
      predict_memory(toy_spec(), {2, OD::Cpu, OD::None}, c, WorldShape{1, 2}, TrainingShape{});
  EXPECT_EQ(stage2.at(Tier::Device, Kind::OptimizerStates), 0);
}

// A served model (every unit frozen): no gradient to reduce, no optimizer to stage, so no
// reduce buckets and no optimizer slots, even where the config offloads the optimizer
// (zeroshard.init_inference names the parameters' tier for both); only the parameter
// buffers are pinned.
TEST(MemoryModel, AFrozenModelHoldsNoBucketsAndNoOptimizerStaging) {
  ModelSpec s = toy_spec();
  s.unit_frozen = {true, true};
  Config c = toy_config(true);
  c.zero.offload_param.max_in_cpu = 0;
  const auto m = predict_memory(s, {3, OD::Nvme, OD::Nvme}, c, WorldShape{1, 2}, TrainingShape{});
  EXPECT_EQ(m.at(Tier::Device, Kind::CommBuckets), 0);
  EXPECT_EQ(m.at(Tier::Host, Kind::PinnedBuffers), 5 * 4096);
  EXPECT_EQ(m.total(Tier::Device), 2 * (3300 + 1600));
  for (Kind k : {Kind::MasterParams, Kind::OptimizerStates, Kind::Grads, Kind::GradsFp32})
    for (Tier t : {Tier::Device, Tier::Host, Tier::Nvme}) EXPECT_EQ(m.at(t, k), 0);
  // One unit frozen: buckets of the other's 3,200 parameters at most.
  s.unit_frozen = {true, false};
  c.zero.reduce_bucket_size = 5000;
  const auto half =
      predict_memory(s, {3, OD::None, OD::None}, c, WorldShape{1, 2}, TrainingShape{});
  EXPECT_EQ(half.at(Tier::Device, Kind::CommBuckets), 2 * 3200);
}

// Served Llama-2-7b, 8 sequences of 2,048 tokens in bf16: the KV cache is 2 (keys and
// values) x 32 layers x 8 x 2,048 x 4,096 x 2 bytes = 8 GiB; beside it only one block's
// temporaries and the last position's logits, not the 32 blocks training keeps.
TEST(MemoryModel, ServedActivationsAreTheKvCacheAndOneBlocksTemporaries) {
  const ModelSpec s = spec_from_hf_file(std::string(zeroshard::testing::source_dir()) +
                                        "/tests/data/hf/llama2_7b.json");
  TrainingShape t;
  t.seq = 2048;
  t.micro_batch = 8;
  t.inference = true;
  EXPECT_EQ(kv_cache_bytes(s, t, 2), int64_t{8} << 30);
  const int64_t served = activation_bytes(s, t, 2);
  t.inference = false;
  const int64_t trained = activation_bytes(s, t, 2);
  EXPECT_GT(served, int64_t{8} << 30);
  EXPECT_LT(served - (int64_t{8} << 30), trained / 16);
}
