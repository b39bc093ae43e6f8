// Optimizer and parameter offload (host RAM, NVMe through io_uring) on real ranks:
// training ends at the same parameters as without offload, the ledger's host and NVMe
// bytes are the plan's, and no swap file outlives the run.
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/Error.h"
#include "common/MemoryKinds.h"
#include "engine/EngineImpl.h"
#include "engine/NcclGroup.h"
#include "offload/PinnedPool.h"
#include "tests/engine/RankRuns.h"
#include "tests/offload/Scratch.h"

using namespace zeroshard;
using namespace zeroshard::testing;
namespace fs = std::filesystem;

namespace {

Scenario base(int stage, const std::string& dtype) {
  Scenario s;
  s.model = "transformer";
  s.stage = stage;
  s.dtype = dtype;
  s.steps = 10;
  s.clip = 1.0;
  s.sub_group = 1000;  // several sub-groups per shard: the swap pipeline really pipelines
  return s;
}

double memory(const RankOutput& r, Tier tier, Kind kind, int column) {
  const int64_t index = (static_cast<int64_t>(tier) * kNumKinds + static_cast<int64_t>(kind)) * 3;
  return r.memory[index + column].item<double>();
}

void expect_same_parameters(const std::vector<RankOutput>& got,
                            const std::vector<RankOutput>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].params.size(), want[r].params.size());
    for (size_t i = 0; i < got[r].params.size(); ++i) {
      const double scale = want[r].params[i].abs().max().item<double>();
      const double diff = (got[r].params[i] - want[r].params[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6 * std::max(scale, 1e-12)) << "rank " << r << " parameter " << i;
    }
  }
}

int swap_dirs_left(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    n += e.path().filename().string().rfind("zeroshard-swap-", 0) == 0;
  return n;
}

struct Case {
  int stage;
  std::string dtype, opt, param;
  int accum = 1;
  std::string device = "cpu";
  int world = 2;
};

void check(const Case& c) {
  SCOPED_TRACE("stage " + std::to_string(c.stage) + " " + c.dtype + " optimizer " + c.opt +
               " params " + c.param + " accumulation " + std::to_string(c.accum) + " on " +
               c.device + " x" + std::to_string(c.world));
  Scenario plain_run = base(c.stage, c.dtype);
  plain_run.accum = c.accum;
  plain_run.device = c.device;
  const auto plain = run_ranks(plain_run, c.world);
  Scenario s = plain_run;
  s.offload_opt = c.opt;
  s.offload_param = c.param;
  s.nvme_path = zeroshard::testing::scratch_dir("offload-" + c.opt + c.param +
                                                std::to_string(c.stage) + c.dtype);
  s.max_in_cpu = 0;  // every parameter shard on NVMe
  const auto off = run_ranks(s, c.world);
  ASSERT_EQ(off.size(), static_cast<size_t>(c.world));
  expect_same_parameters(off, plain);
  const Tier opt_tier = c.opt == "nvme" ? Tier::Nvme : Tier::Host;
  for (const auto& r : off) {
    for (auto [tier, kind] :
         {std::pair{opt_tier, Kind::MasterParams}, std::pair{opt_tier, Kind::OptimizerStates},
          std::pair{Tier::Host, Kind::GradsFp32}}) {
      const double predicted = memory(r, tier, kind, 1);
      EXPECT_GT(predicted, 0) << tier_name(tier) << " " << kind_name(kind);
      EXPECT_NEAR(memory(r, tier, kind, 0), predicted, 0.02 * predicted)
          << tier_name(tier) << " " << kind_name(kind);
    }
    // The swap and parameter buffers, as planned. On the host no gradient staging; on a
    // GPU the copies' staging is counted while they run, and the plan's is an upper bound.
    const double pinned = memory(r, Tier::Host, Kind::PinnedBuffers, 1);
    if (c.device == "cpu") {
      EXPECT_EQ(memory(r, Tier::Host, Kind::PinnedBuffers, 0), pinned);
    } else {
      EXPECT_LE(memory(r, Tier::Host, Kind::PinnedBuffers, 0), pinned);
    }
    if (c.opt == "nvme") {
      EXPECT_GT(pinned, 0);
    }
    // Nothing of the optimizer stays on the device.
    EXPECT_EQ(memory(r, Tier::Device, Kind::OptimizerStates, 0), 0);
    if (c.param != "none") {
      const Tier param_tier = c.param == "nvme" ? Tier::Nvme : Tier::Host;
      const double predicted = memory(r, param_tier, Kind::Params, 1);
      EXPECT_GT(predicted, 0);
      EXPECT_NEAR(memory(r, param_tier, Kind::Params, 0), predicted, 0.02 * predicted);
      // Whole units only at rest; at construction also one unit's shard, cut on the
      // device before it leaves for its tier, which the plan counts.
      const double device_peak = memory(r, Tier::Device, Kind::Params, 2);
      EXPECT_GT(device_peak, memory(r, Tier::Device, Kind::Params, 0));
      EXPECT_LE(device_peak, memory(r, Tier::Device, Kind::Params, 1));
    }
  }
  EXPECT_EQ(swap_dirs_left(s.nvme_path), 0);
}

// Bit for bit: the overlapped step is the same arithmetic in another order of groups.
void expect_identical(const std::vector<RankOutput>& got, const std::vector<RankOutput>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].params.size(), want[r].params.size());
    for (size_t i = 0; i < got[r].params.size(); ++i) {
      EXPECT_TRUE(at::equal(got[r].params[i], want[r].params[i]))
          << "rank " << r << " parameter " << i << ": max difference "
          << (got[r].params[i] - want[r].params[i]).abs().max().item<double>();
    }
    EXPECT_TRUE(at::equal(got[r].stats, want[r].stats)) << "rank " << r << " losses and norms:\n"
                                                        << got[r].stats << "\nwant\n"
                                                        << want[r].stats;
  }
}

// A one-rank engine in this process, stage 2, optimizer on the CPU, the step overlapped.
struct OneRank {
  OneRank() {
    torch::manual_seed(0);
    model = torch::nn::Linear(16, 4).ptr();
    Config c;
    c.zero.stage = 2;
    c.zero.offload_optimizer.device = OffloadDevice::Cpu;
    c.zero.offload_optimizer.overlap_step = "true";
    engine = std::make_unique<EngineImpl>(model, c);
  }
  void backward() { engine->backward(model->forward(torch::ones({2, 16})).square().mean()); }
  std::shared_ptr<torch::nn::LinearImpl> model;
  std::unique_ptr<EngineImpl> engine;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Overlap {
  int stage;
  std::string dtype, opt, param;
  int accum;
};

// Trains `c` twice on `world` ranks, the step after backward and inside it, and expects
// the same bits.
void check_overlap(const Overlap& c, int world, const std::string& device) {
  SCOPED_TRACE("stage " + std::to_string(c.stage) + " " + c.dtype + " optimizer " + c.opt +
               " params " + c.param + " accumulation " + std::to_string(c.accum) + " on " + device);
  Scenario s = base(c.stage, c.dtype);
  s.clip = 0;  // clipping would rule the overlap out
  s.accum = c.accum;
  s.persist = 0;  // every stage-3 unit sharded
  s.frozen = s.unused = true;
  s.offload_opt = c.opt;
  s.offload_param = c.param;
  s.device = device;
  s.nvme_path = zeroshard::testing::scratch_dir("overlap-" + c.opt + std::to_string(c.stage));
  s.overlap_step = "false";
  const auto after = run_ranks(s, world);
  s.overlap_step = "true";
  const auto during = run_ranks(s, world);
  ASSERT_EQ(during.size(), static_cast<size_t>(world));
  expect_identical(during, after);
  EXPECT_EQ(swap_dirs_left(s.nvme_path), 0);
}

// offload_optimizer.ratio below 1 (optim/SplitOptimizer.h) against `reference` (the
// same run with every shard on the host, or the optimizer on the device): the same
// parameters, losses and norms, and the ledger's bytes on each tier are the plan's, with
// the optimizer really split between the two.
void check_split(Scenario s, int world, double ratio, bool bit_exact) {
  SCOPED_TRACE(s.dtype + " ratio " + std::to_string(ratio) + " on " + s.device + " x" +
               std::to_string(world));
  const auto reference = run_ranks(s, world);
  s.offload_opt = "cpu";
  s.ratio = ratio;
  const auto split = run_ranks(s, world);
  ASSERT_EQ(split.size(), static_cast<size_t>(world));
  if (bit_exact) {
    expect_identical(split, reference);
  } else {
    expect_same_parameters(split, reference);
  }
  for (const auto& r : split) {
    for (Tier tier : {Tier::Device, Tier::Host}) {
      for (Kind kind : {Kind::MasterParams, Kind::OptimizerStates, Kind::GradsFp32}) {
        if (tier == Tier::Device && kind == Kind::MasterParams && s.dtype == "fp32") continue;
        const double predicted = memory(r, tier, kind, 1);
        const bool holds = tier == Tier::Device ? ratio < 1 : ratio > 0;
        EXPECT_EQ(predicted > 0, holds) << tier_name(tier) << " " << kind_name(kind);
        EXPECT_EQ(memory(r, tier, kind, 0), predicted) << tier_name(tier) << " " << kind_name(kind);
      }
    }
    // Adam's m and v, 8 bytes an element, split between the two.
    const double device = memory(r, Tier::Device, Kind::OptimizerStates, 0) / 8;
    const double host = memory(r, Tier::Host, Kind::OptimizerStates, 0) / 8;
    EXPECT_GE(device / (device + host), 1 - ratio);
  }
}

}  // namespace

TEST(EngineOffload, OptimizerToCpuStages1To3) {
  check({1, "bf16", "cpu", "none"});
  check({2, "fp32", "cpu", "none"});
  check({3, "bf16", "cpu", "none"});
}

TEST(EngineOffload, OptimizerToNvmeStage2And3) {
  check({2, "bf16", "nvme", "none"});
  check({3, "fp32", "nvme", "none"});
}

TEST(EngineOffload, ParametersAndOptimizerToNvmeStage3) {
  check({3, "fp32", "nvme", "nvme"});
  check({3, "bf16", "nvme", "nvme"});
}

TEST(EngineOffload, ParametersToCpuStage3) {
  check({3, "fp32", "cpu", "cpu"});
}

// The same on a GPU (skipped, with the reason, where none is visible, as on CI): the
// reduced shards come to the host and the updated parameters go back on copy streams
// (sharding/CopyStream.h), against the optimizer on the device. One rank over NCCL, and
// two sharing the GPU over Gloo; with accumulation 2 the second micro-batch's shard lands
// in staging that the host adds; with parameters on NVMe the kept shards live in host
// memory and go up to the GPU at each gather.
TEST(EngineOffload, GpuOptimizerOffloadEndsWhereTheDeviceOptimizerDoes) {
  if (const std::string why = why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  check({1, "fp32", "cpu", "none", 2, "cuda", 1});  // the shard lands as at stage 2
  check({2, "fp32", "cpu", "none", 2, "cuda", 1});
  check({3, "fp32", "nvme", "none", 1, "cuda", 1});
  check({3, "fp32", "nvme", "nvme", 1, "cuda", 1});  // shards: host RAM <-> NVMe -> GPU
  check({3, "fp32", "cpu", "cpu", 2, "cuda", 1});    // shards in host RAM, copied up unwaited
  ::setenv("ZS_DIST_BACKEND", "gloo", 1);            // inherited by the ranks
  check({3, "fp32", "cpu", "none", 2, "cuda", 2});
  ::unsetenv("ZS_DIST_BACKEND");
}

// offload_optimizer.ratio: the first units' Adam state stays where the parameters are and
// steps there, the rest steps on the host, as DeepSpeed's ZeRO-Offload++ splits them. On
// the CPU both halves run CPU Adam's arithmetic, so the run is the all-host run's bit for
// bit (clipping, so both take the same norm; accumulation 2; a frozen and an unused
// parameter); the device's bytes and the host's are each the plan's.
TEST(EngineOffload, PartOfTheOptimizerKeptOnTheDeviceStepsAsAllOfItOnTheHost) {
  for (const char* dtype : {"bf16", "fp32"}) {
    Scenario s = base(3, dtype);
    s.accum = 2;
    s.persist = 0;
    s.frozen = s.unused = true;
    s.offload_opt = "cpu";
    check_split(s, 2, 0.5, /*bit_exact=*/true);
  }
  Scenario s = base(3, "bf16");
  s.offload_opt = "cpu";
  check_split(s, 2, 0.0, true);  // every shard on the device
}

// The same on a GPU: the kept shards step with torch's fused Adam on the device, the rest
// with CPU Adam, against the optimizer all on the device.
TEST(EngineOffload, GpuPartOfTheOptimizerKeptOnTheDeviceEndsWhereTheDeviceOptimizerDoes) {
  if (const std::string why = why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  Scenario s = base(3, "fp32");
  s.accum = 2;
  s.device = "cuda";
  check_split(s, 1, 0.5, /*bit_exact=*/false);
}

// Staging buffers for a model on a GPU are page-locked where a GPU is visible, and stay
// pageable (counted all the same, no error) where none is, as on CI.
TEST(EngineOffload, StagingBuffersArePageLockedWhereAGpuIs) {
  MemoryLedger ledger;
  PinnedPool for_gpu(2, 1 << 20, &ledger, /*page_lock=*/true);
  EXPECT_EQ(for_gpu.page_locked(), why_no_gpu().empty()) << why_no_gpu();
  PinnedPool for_host(2, 1 << 20, &ledger);
  EXPECT_FALSE(for_host.page_locked());
  EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 4 << 20);
}

// offload_optimizer.overlap_step (optim/OverlappedStep.h): every group steps on a worker
// inside the backward that ends the window. Training ends at exactly the parameters,
// losses and gradient norms of the step made after backward, at stages 2 and 3, with
// accumulation, a frozen and an unused parameter, optimizer state in RAM or on NVMe, bf16
// and parameter shards in host RAM.
TEST(EngineOffload, StepOverlappedWithBackwardIsExactlyTheStepAfterIt) {
  for (const auto& c : {Overlap{2, "fp32", "cpu", "none", 2}, Overlap{3, "bf16", "cpu", "none", 1},
                        Overlap{3, "fp32", "nvme", "none", 2}, Overlap{3, "bf16", "cpu", "cpu", 1}})
    check_overlap(c, 2, "cpu");
}

// The same on a GPU (skipped, with the reason, where none is visible, as on CI): one rank
// over NCCL; the reduced shards come to page-locked host memory on a copy stream, and the
// worker's updated parameters go back on another (sharding/CopyStream.h).
TEST(EngineOffload, GpuStepOverlappedWithBackwardIsExactlyTheStepAfterIt) {
  if (const std::string why = why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  for (const auto& c : {Overlap{2, "bf16", "cpu", "none", 2}, Overlap{3, "fp32", "nvme", "none", 1},
                        Overlap{3, "bf16", "cpu", "cpu", 1}})
    check_overlap(c, 1, "cuda");
}

// What the overlapped step cannot take back is refused, by name: discarding the
// gradients of a window whose step is made, settings changed too late for it, and a
// second window's backward before step().
TEST(EngineOffload, OverlappedStepRefusesWhatComesTooLateForIt) {
  const std::string key = "zero_optimization.offload_optimizer.overlap_step";
  {
    OneRank one;
    one.backward();
    const std::string e = error_of([&] { one.engine->zero_grad(); });
    EXPECT_NE(e.find("zero_grad() after the backward that ended an accumulation window"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find(key), std::string::npos) << e;
    EXPECT_TRUE(one.engine->step());
    EXPECT_EQ(error_of([&] { one.engine->zero_grad(); }), "") << "nothing pending after step()";
  }
  {
    OneRank one;
    one.backward();
    ParamGroupOptions changed = one.engine->param_group(0);
    changed.lr = 0.5;
    one.engine->set_param_group(0, changed);
    const std::string e = error_of([&] { one.engine->step(); });
    EXPECT_NE(e.find("a parameter group's settings changed after the backward"), std::string::npos)
        << e;
  }
  {
    OneRank one;
    one.backward();
    const std::string e = error_of([&] { one.backward(); });
    EXPECT_NE(e.find("backward() ended an accumulation window again before step()"),
              std::string::npos)
        << e;
  }
}
