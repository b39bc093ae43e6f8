#include "plan/Planner.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "common/Error.h"
#include "plan/HfConfig.h"
#include "plan/TrainingSettings.h"
#include "tests/common/TestPaths.h"
#include "tests/plan/ToySpec.h"

using namespace zeroshard;
using OD = OffloadDevice;
using zeroshard::testing::toy_spec;

namespace {

// Everything open to the planner, with the toy sizes of MemoryModelTest.
Config open_config() {
  Config c;
  c.bf16 = true;
  c.zero.stage.reset();
  c.zero.offload_optimizer.device = OD::Auto;
  c.zero.offload_param.device = OD::Auto;
  c.zero.reduce_bucket_size = 1000;
  c.zero.allgather_bucket_size = 500;
  c.zero.stage3_prefetch_bucket_size = 100;
  c.zero.stage3_max_live_parameters = 5000;
  c.zero.stage3_param_persistence_threshold = 10;
  c.zero.sub_group_size = 800;
  return c;
}

Plan plan_for(int64_t device, int64_t host, int64_t nvme, Config c = open_config()) {
  HardwareBudget b;
  b.device_bytes = device;
  b.host_bytes = host;
  b.nvme_bytes = nvme;
  b.headroom = 0;
  return make_plan(toy_spec(), c, WorldShape{1, 2}, TrainingShape{}, b);
}

}  // namespace

// Device totals per rank (MemoryModelTest): stage 0 130,000; 1 79,800; 2 67,000; 3 66,200;
// stage 1 + cpu optimizer 28,600 with 59,392 on the host per rank (118,784 per node).
TEST(Planner, PrefersTheLowestStageThatFits) {
  EXPECT_EQ(plan_for(130'000, 0, 0).option, (PlanOption{0, OD::None, OD::None}));
  EXPECT_EQ(plan_for(129'999, 0, 0).option, (PlanOption{1, OD::None, OD::None}));
  EXPECT_EQ(plan_for(79'000, 0, 0).option, (PlanOption{2, OD::None, OD::None}));
  EXPECT_EQ(plan_for(67'000, 0, 0).option, (PlanOption{2, OD::None, OD::None}));
  EXPECT_EQ(plan_for(66'999, 0, 0).option, (PlanOption{3, OD::None, OD::None}));
}

TEST(Planner, OffloadsTheOptimizerToCpuBeforeNvme) {
  const Plan cpu = plan_for(30'000, 118'784, 1 << 30);
  EXPECT_TRUE(cpu.fits);
  EXPECT_EQ(cpu.option, (PlanOption{1, OD::Cpu, OD::None}));
  EXPECT_EQ(cpu.config.zero.stage, 1);
  EXPECT_EQ(cpu.config.zero.offload_optimizer.device, OD::Cpu);
  // Small sub-groups shrink the NVMe swap slots: 25,792 host bytes per rank, where
  // CPU offload needs 59,392.
  Config small_groups = open_config();
  small_groups.zero.sub_group_size = 100;
  const Plan nvme = plan_for(30'000, 100'000, 1 << 30, small_groups);
  EXPECT_TRUE(nvme.fits);
  EXPECT_EQ(nvme.option.optimizer, OD::Nvme);
  EXPECT_EQ(nvme.config.zero.offload_optimizer.nvme_path, "/local_nvme");
}

TEST(Planner, SaysByHowMuchNothingFits) {
  const Plan plan = plan_for(1000, 1000, 0);
  EXPECT_FALSE(plan.fits);
  EXPECT_NE(plan.summary.find("nothing fits"), std::string::npos) << plan.summary;
  EXPECT_NE(plan.summary.find("short by"), std::string::npos) << plan.summary;
  for (const auto& e : plan.options) EXPECT_FALSE(e.fits);
}

TEST(Planner, FixedKeysBoundTheChoice) {
  Config c = open_config();
  c.zero.stage = 3;
  c.zero.offload_optimizer.device = OD::None;
  c.zero.offload_param.device = OD::None;
  const Plan plan = plan_for(1'000'000, 0, 0, c);
  EXPECT_EQ(plan.option, (PlanOption{3, OD::None, OD::None}));
  int allowed = 0;
  for (const auto& e : plan.options) allowed += e.allowed;
  EXPECT_EQ(allowed, 1);
}

// Parameters on NVMe with the optimizer on the device is no choice zeroshard runs (the
// offloaded optimizer brings each NVMe shard in for its update): the error names the
// keys and lists what runs.
TEST(Planner, FixedKeysThatAllowNothingAreNamedWithWhatRuns) {
  Config c = open_config();
  c.zero.stage = 3;
  c.zero.offload_optimizer.device = OD::None;
  c.zero.offload_param.device = OD::Nvme;
  try {
    plan_for(1'000'000, 1'000'000, 1'000'000, c);
    FAIL() << "planned";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part :
         {"'zero_optimization.stage' 3", "'zero_optimization.offload_optimizer.device' 'none'",
          "'zero_optimization.offload_param.device' 'nvme'", "stage 3, optimizer cpu, params nvme",
          "allowed: stage 0; stage 1"}) {
      EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
    }
  }
}

TEST(Planner, HeadroomIsKeptFree) {
  HardwareBudget b;
  b.device_bytes = 130'000;
  b.headroom = 0.10;
  const Plan plan = make_plan(toy_spec(), open_config(), WorldShape{1, 2}, TrainingShape{}, b);
  EXPECT_EQ(plan.option.stage, 1);  // 130,000 needs all of it; 117,000 usable
}

TEST(Planner, AutoKnobsFollowHiddenSize) {
  const ModelSpec s =
      spec_from_hf_file(std::string(zeroshard::testing::source_dir()) + "/tests/data/hf/gpt2.json");
  Config c;
  c.zero.reduce_bucket_size.reset();
  c.zero.stage3_prefetch_bucket_size.reset();
  c.zero.stage3_param_persistence_threshold.reset();
  c.zero.sub_group_size.reset();
  c.optimizer.lr.reset();
  std::vector<std::string> reasons;
  const Config r = resolve_auto_knobs(c, s, WorldShape{1, 1}, reasons);
  EXPECT_EQ(r.zero.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(r.zero.stage3_prefetch_bucket_size, 9 * 768 * 768 / 10);
  EXPECT_EQ(r.zero.stage3_param_persistence_threshold, 7680);
  EXPECT_EQ(r.zero.sub_group_size, 100'000'000);
  EXPECT_DOUBLE_EQ(*r.optimizer.lr, 1e-3);
  EXPECT_EQ(reasons.size(), 7u);  // and the micro-batch (1) and accumulation (1)
  const std::string all = fmt::format("{}", fmt::join(reasons, "\n"));
  EXPECT_NE(all.find("reduce_bucket_size: auto -> 589824 (Hugging Face"), std::string::npos) << all;
}

TEST(Planner, ResolvedConfigHasNoAutoLeft) {
  Config c = open_config();
  c.zero.reduce_bucket_size.reset();
  c.optimizer.beta1.reset();
  const Plan plan = plan_for(1'000'000, 0, 0, c);
  const std::string yaml = emit_config_yaml(plan.config);
  EXPECT_EQ(yaml.find(": auto"), std::string::npos) << yaml;
  EXPECT_NO_THROW(load_config_string(yaml, "plan"));
}

namespace {

Plan plan_on(const WorldShape& world, const Config& c, int64_t device) {
  HardwareBudget b;
  b.device_bytes = device;
  b.headroom = 0;
  return make_plan(toy_spec(), c, world, TrainingShape{}, b);
}

Config stage3_mics_auto() {
  Config c = open_config();
  c.zero.stage = 3;
  c.zero.mics_shard_size.reset();
  return c;
}

std::string all_reasons(const Plan& p) {
  return fmt::format("{}", fmt::join(p.reasons, "\n"));
}

}  // namespace

TEST(Planner, MicsAutoShardsInsideEachNodeWhenThatFits) {
  const Plan p = plan_on(WorldShape{2, 2}, stage3_mics_auto(), 1'000'000);
  EXPECT_EQ(p.config.zero.mics_shard_size, 2);
  EXPECT_EQ(p.settings.mics_shard_size, 2);
  EXPECT_NE(all_reasons(p).find("mics_shard_size: auto -> 2 (one shard group per node"),
            std::string::npos)
      << all_reasons(p);
  EXPECT_EQ(emit_config_yaml(p.config).find(": auto"), std::string::npos);
}

TEST(Planner, MicsAutoShardsEverywhereOnOneNodeOrWhenGroupsWouldNotFit) {
  const Plan one_node = plan_on(WorldShape{1, 4}, stage3_mics_auto(), 1'000'000);
  EXPECT_EQ(one_node.config.zero.mics_shard_size, -1);
  EXPECT_NE(all_reasons(one_node).find("auto -> -1 (one node"), std::string::npos);
  // A device that holds stage 3 sharded over all 4 ranks but not over groups of 2.
  Config c = open_config();
  c.zero.mics_shard_size = -1;
  const int64_t everywhere =
      predict_memory(toy_spec(), {3, OD::None, OD::None}, c, WorldShape{2, 2}, TrainingShape{})
          .total(Tier::Device);
  c.zero.mics_shard_size = 2;
  const int64_t grouped =
      predict_memory(toy_spec(), {3, OD::None, OD::None}, c, WorldShape{2, 2}, TrainingShape{})
          .total(Tier::Device);
  ASSERT_LT(everywhere, grouped);
  const Plan tight = plan_on(WorldShape{2, 2}, stage3_mics_auto(), everywhere);
  EXPECT_TRUE(tight.fits);
  EXPECT_EQ(tight.option, (PlanOption{3, OD::None, OD::None}));
  EXPECT_EQ(tight.config.zero.mics_shard_size, -1);
  EXPECT_NE(all_reasons(tight).find("sharding inside each node of 2 ranks would need"),
            std::string::npos)
      << all_reasons(tight);
}

TEST(Planner, MicsShardSizeMustDivideTheRanks) {
  Config c = open_config();
  c.zero.stage = 3;
  c.zero.mics_shard_size = 3;
  try {
    plan_on(WorldShape{2, 2}, c, 1'000'000);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "'zero_optimization.mics_shard_size' is 3 with 4 data-parallel ranks"),
              std::string::npos)
        << e.what();
  }
  c.zero.stage.reset();  // stage auto: groups rule out stage 0
  c.zero.mics_shard_size = 2;
  EXPECT_EQ(plan_on(WorldShape{2, 2}, c, 1'000'000).option.stage, 1);
}

namespace {

Config stage3_hpz_auto(std::optional<int64_t> mics = -1) {
  Config c = open_config();
  c.zero.stage = 3;
  c.zero.mics_shard_size = mics;
  c.zero.hpz_partition_size.reset();
  return c;
}

}  // namespace

TEST(Planner, HpzAutoKeepsACopyPerNodeWhenThatFits) {
  const Plan p = plan_on(WorldShape{2, 2}, stage3_hpz_auto(), 1'000'000);
  EXPECT_EQ(p.settings.hpz_partition_size, 2);
  EXPECT_GT(p.predicted.at(Tier::Device, Kind::SecondaryParams), 0);
  EXPECT_NE(all_reasons(p).find("zero_hpz_partition_size: auto -> 2 (ZeRO++ hpZ"),
            std::string::npos)
      << all_reasons(p);
  EXPECT_EQ(emit_config_yaml(p.config).find(": auto"), std::string::npos);
}

TEST(Planner, HpzAutoStaysOffWhereItWouldGainNothingOrNotFit) {
  auto expect_off = [](const Plan& p, const std::string& why) {
    EXPECT_EQ(p.settings.hpz_partition_size, 1);
    EXPECT_EQ(p.predicted.at(Tier::Device, Kind::SecondaryParams), 0);
    EXPECT_NE(all_reasons(p).find("zero_hpz_partition_size: auto -> 1 (" + why), std::string::npos)
        << all_reasons(p);
  };
  expect_off(plan_on(WorldShape{1, 4}, stage3_hpz_auto(), 1'000'000), "one node");
  // Both auto: shard groups win (fewer bytes between nodes), and need no copy.
  const Plan both = plan_on(WorldShape{2, 2}, stage3_hpz_auto(std::nullopt), 1'000'000);
  EXPECT_EQ(both.settings.mics_shard_size, 2);
  expect_off(both, "mics_shard_size keeps every gather on the node already");
  Config stage2 = stage3_hpz_auto();
  stage2.zero.stage = 2;
  expect_off(plan_on(WorldShape{2, 2}, stage2, 1'000'000), "stage 2 gathers no parameters");
  // A device that holds stage 3 without the copy and not with it.
  Config c = open_config();
  c.zero.mics_shard_size = -1;
  const int64_t without =
      predict_memory(toy_spec(), {3, OD::None, OD::None}, c, WorldShape{2, 2}, TrainingShape{})
          .total(Tier::Device);
  const Plan tight = plan_on(WorldShape{2, 2}, stage3_hpz_auto(), without);
  EXPECT_TRUE(tight.fits);
  expect_off(tight, "the secondary copy would need");
}

TEST(Planner, HpzSetRulesOutGroupsAndStagesBelow3) {
  Config c = open_config();
  c.zero.mics_shard_size.reset();
  c.zero.hpz_partition_size = 2;
  const Plan p = plan_on(WorldShape{2, 2}, c, 1'000'000);
  EXPECT_EQ(p.option.stage, 3);  // stage auto: the copy is of stage 3's parameters
  EXPECT_EQ(p.settings.mics_shard_size, -1);
  EXPECT_NE(all_reasons(p).find("mics_shard_size: auto -> -1 (zero_hpz_partition_size 2 keeps"),
            std::string::npos)
      << all_reasons(p);
  c.zero.hpz_partition_size = 3;
  try {
    plan_on(WorldShape{2, 2}, c, 1'000'000);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "'zero_optimization.zero_hpz_partition_size' is 3 with 4 data-parallel ranks; "
                  "allowed: 1, auto, or a group size that divides 4"),
              std::string::npos)
        << e.what();
  }
}

// offload_optimizer.overlap_step auto: on for an offloaded optimizer on a GPU where the
// step inside backward is exact; off, with the reason, on the CPU, with clipping, fp16 or
// NVMe parameter shards; nothing said where nothing is offloaded. Never left auto.
TEST(Planner, OverlapStepAutoIsOnWhereTheStepInsideBackwardIsExactOnAGpu) {
  auto plan = [](Config c, bool on_host, OD optimizer = OD::Cpu, OD params = OD::None) {
    c.zero.stage = 3;
    c.zero.offload_optimizer.device = optimizer;
    c.zero.offload_param.device = params;
    c.zero.offload_optimizer.nvme_path = c.zero.offload_param.nvme_path = "/tmp";
    TrainingShape shape;
    shape.device_is_host = on_host;
    HardwareBudget b;
    b.device_bytes = 1'000'000;
    b.host_bytes = 1'000'000'000;
    b.nvme_bytes = 1'000'000'000;
    b.headroom = 0;
    return make_plan(toy_spec(), c, WorldShape{1, 2}, shape, b);
  };
  const std::string key = "zero_optimization.offload_optimizer.overlap_step: auto -> ";
  const Plan gpu = plan(open_config(), false);
  EXPECT_TRUE(gpu.settings.overlap_step);
  EXPECT_NE(all_reasons(gpu).find(key + "true (each gradient shard steps"), std::string::npos)
      << all_reasons(gpu);
  EXPECT_EQ(emit_config_yaml(gpu.config).find(": auto"), std::string::npos);
  auto expect_off = [&](const Plan& p, const std::string& why) {
    EXPECT_FALSE(p.settings.overlap_step);
    EXPECT_NE(all_reasons(p).find(key + "false (" + why), std::string::npos) << all_reasons(p);
    EXPECT_EQ(emit_config_yaml(p.config).find(": auto"), std::string::npos);
  };
  expect_off(plan(open_config(), true), "the model is on the CPU");
  Config clipped = open_config();
  clipped.gradient_clipping = 1.0;
  expect_off(plan(clipped, false), "gradient_clipping 1 needs the norm");
  Config fp16 = open_config();
  fp16.bf16 = false;
  fp16.fp16.enabled = true;
  expect_off(plan(fp16, false), "fp16 loss scaling");
  expect_off(plan(open_config(), false, OD::Cpu, OD::Nvme), "backward's gathers read the NVMe");
  const Plan none = plan(open_config(), false, OD::None);
  EXPECT_FALSE(none.settings.overlap_step);
  EXPECT_EQ(all_reasons(none).find("overlap_step"), std::string::npos) << all_reasons(none);
  Config set = open_config();
  set.zero.offload_optimizer.overlap_step = "false";
  EXPECT_FALSE(plan(set, false).settings.overlap_step);
}

// Which Adam a config means, as DeepSpeed decides it: AdamW always decouples weight
// decay; Adam does too unless adam_w_mode is false (then it is torch's Adam, L2).
TEST(TrainingSettings, DeepSpeedsAdamDecouplesWeightDecayUnlessAdamWModeIsOff) {
  OptimizerConfig o;
  o.type = "AdamW";
  EXPECT_TRUE(adam_defaults(o).decoupled);
  o.type = "Adam";
  EXPECT_TRUE(adam_defaults(o).decoupled);
  o.adam_w_mode = false;
  EXPECT_FALSE(adam_defaults(o).decoupled);
  o.type = "AdamW";
  EXPECT_TRUE(adam_defaults(o).decoupled);
}

// A torch.optim class whose update is elementwise pages its state through NVMe, so the
// planner may put it there; transformers' Adafactor (not elementwise) and Lamb may not.
// None brings NVMe parameter shards in for its update.
TEST(Planner, NvmeForATorchOptimizerOnlyWhereItsUpdateIsElementwise) {
  Config c = open_config();
  c.optimizer = load_config_string(R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})",
                                   "ds.json")
                    .config.optimizer;
  auto allowed = [](const Plan& plan, OD optimizer, OD params) {
    int n = 0;
    for (const auto& e : plan.options)
      n += e.allowed && e.option.optimizer == optimizer && e.option.params == params;
    return n;
  };
  const Plan sgd = plan_for(1'000'000, 1'000'000, 1 << 30, c);
  EXPECT_EQ(allowed(sgd, OD::Nvme, OD::None), 3);  // stages 1, 2 and 3
  EXPECT_EQ(allowed(sgd, OD::Nvme, OD::Nvme) + allowed(sgd, OD::Cpu, OD::Nvme), 0);
  c.optimizer.type = "Adafactor";
  c.optimizer.elementwise = false;
  const Plan adafactor = plan_for(1'000'000, 1'000'000, 1 << 30, c);
  EXPECT_EQ(allowed(adafactor, OD::Nvme, OD::None), 0);
  EXPECT_EQ(allowed(adafactor, OD::Cpu, OD::None), 3);
}

// offload_optimizer.ratio auto at stage 3 with the optimizer on the host: as much of the
// optimizer on the device as its memory holds. The toy's device bytes per rank there: 15,000
// with every shard on the host, 40,600 with the first kept (16 bytes x 1,600 more), 66,200
// with both (stage 3 without offload).
TEST(Planner, OffloadRatioAutoKeepsOnTheDeviceWhatFitsThere) {
  Config c = open_config();
  c.zero.stage = 3;
  c.zero.offload_optimizer.device = OD::Cpu;
  c.zero.offload_param.device = OD::None;
  c.zero.offload_optimizer.ratio.reset();
  const auto ratio_for = [&](int64_t device) {
    const Plan p = plan_for(device, 1 << 30, 0, c);
    EXPECT_TRUE(p.fits) << p.summary;
    return *p.config.zero.offload_optimizer.ratio;
  };
  EXPECT_EQ(ratio_for(15'000), 1.0);
  EXPECT_EQ(ratio_for(40'599), 1.0);
  EXPECT_EQ(ratio_for(40'600), 0.5);
  EXPECT_EQ(ratio_for(66'199), 0.5);
  EXPECT_EQ(ratio_for(66'200), 0.0);
  const Plan half = plan_for(40'600, 1 << 30, 0, c);
  EXPECT_EQ(half.predicted.total(Tier::Device), 40'600);
  const std::string reasons = fmt::format("{}", fmt::join(half.reasons, "\n"));
  EXPECT_NE(reasons.find("zero_optimization.offload_optimizer.ratio: auto -> 0.5"),
            std::string::npos)
      << reasons;
  // overlap_step true steps every shard on the host: auto is 1 there.
  c.zero.offload_optimizer.overlap_step = "true";
  EXPECT_EQ(ratio_for(66'200), 1.0);
  const Plan overlapped = plan_for(66'200, 1 << 30, 0, c);
  const std::string why = fmt::format("{}", fmt::join(overlapped.reasons, "\n"));
  EXPECT_NE(why.find("ratio: auto -> 1 (every optimizer shard steps on the offload device: "
                     "overlap_step true steps every shard on the host"),
            std::string::npos)
      << why;
  // A ratio below 1 rules out every choice but stage 3 with parameters on the device.
  Config fixed = open_config();
  fixed.zero.offload_optimizer.device = OD::Cpu;
  fixed.zero.offload_optimizer.ratio = 0.5;
  const Plan p = plan_for(1 << 30, 1 << 30, 0, fixed);
  EXPECT_EQ(p.option, (PlanOption{3, OD::Cpu, OD::None}));
}

// Nothing fits with every optimizer shard on the host: the summary says that ratio auto
// would. The toy's stage 3 with the optimizer on the host holds 59,392 host bytes per rank
// (118,784 per node; 40,600 device bytes with the first unit's 16 x 1,600 kept there, and
// 25,600 fewer on the host: 67,584 per node).
TEST(Planner, NothingFitsSaysWhenPartOfTheOptimizerOnTheDeviceWould) {
  const Plan plan = plan_for(40'600, 67'584, 0);
  EXPECT_FALSE(plan.fits);
  EXPECT_NE(plan.summary.find("with zero_optimization.offload_optimizer.ratio auto (part of the "
                              "optimizer on the device) stage 3, optimizer cpu fits, at ratio 0.5"),
            std::string::npos)
      << plan.summary;
  EXPECT_EQ(plan_for(40'600, 67'583, 0).summary.find("ratio auto"), std::string::npos);
  Config auto_ratio = open_config();
  auto_ratio.zero.offload_optimizer.ratio.reset();
  const Plan split = plan_for(40'600, 67'584, 0, auto_ratio);
  EXPECT_TRUE(split.fits) << split.summary;
  EXPECT_EQ(split.option, (PlanOption{3, OD::Cpu, OD::None}));
  EXPECT_EQ(split.config.zero.offload_optimizer.ratio, 0.5);
}
