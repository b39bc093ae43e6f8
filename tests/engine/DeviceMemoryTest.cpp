// The device tier's size and the GPU allocator's counts (engine/DeviceMemory.h), and
// memory_report() showing both beside the ledger. One process, world size 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "engine/DeviceMemory.h"
#include "engine/NcclGroup.h"
#include "engine/EngineImpl.h"

using namespace zeroshard;

namespace {

// MemTotal from /proc/meminfo, in bytes: the kernel's own count of usable RAM.
int64_t mem_total() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

// The first GPU's memory as nvidia-smi reports it, in bytes; 0 without nvidia-smi.
int64_t nvidia_smi_total() {
  FILE* p = popen("nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0", "r");
  if (!p) return 0;
  long long mib = 0;
  const int got = std::fscanf(p, "%lld", &mib);
  pclose(p);
  return got == 1 ? mib * 1024 * 1024 : 0;
}

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(256, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 256));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

MemoryDetail one_step_report(const c10::Device& device) {
  torch::manual_seed(0);
  auto model = std::make_shared<Mlp>();
  model->to(device);
  Config c;
  c.zero.stage = 2;
  EngineImpl engine(model, c);
  const at::Tensor x = torch::randn({64, 256}, torch::TensorOptions().device(device));
  engine.backward(model->forward(x).square().mean());
  engine.step();
  return engine.memory_detail();
}

}  // namespace

TEST(DeviceMemory, OnTheHostTheDeviceTierIsRamSharedByTheLocalRanks) {
  const int64_t ram = mem_total();
  ASSERT_GT(ram, 0);
  EXPECT_EQ(host_memory_bytes(), ram);
  EXPECT_EQ(device_capacity(c10::Device(c10::kCPU), 1), ram);
  EXPECT_EQ(device_capacity(c10::Device(c10::kCPU), 4), ram / 4);
  EXPECT_FALSE(allocator_stats(c10::Device(c10::kCPU)).has_value());
}

TEST(DeviceMemory, TheReportSaysWhatThePlanWasMadeForAndHasNoAllocatorOnTheHost) {
  const MemoryDetail r = one_step_report(c10::Device(c10::kCPU));
  EXPECT_EQ(r.device_capacity, mem_total());
  EXPECT_FALSE(r.allocator.has_value());
  const MemoryReport pub = r.to_public();
  EXPECT_NE(pub.to_string().find("device capacity planned with: " + std::to_string(mem_total())),
            std::string::npos)
      << pub.to_string();
}

// The public report (include/zeroshard/Types.h) carries the ledger's and the memory
// model's bytes as they are, under the tiers' and kinds' names.
TEST(DeviceMemory, ThePublicReportHoldsEveryTierAndKindOfTheLedgerAndThePlan) {
  const MemoryDetail r = one_step_report(c10::Device(c10::kCPU));
  const MemoryReport pub = r.to_public();
  ASSERT_EQ(pub.uses.size(), kNumTiers * kNumKinds);
  ASSERT_EQ(pub.tiers.size(), kNumTiers);
  int64_t nonzero = 0;
  for (size_t t = 0; t < kNumTiers; ++t) {
    const auto tier = static_cast<Tier>(t);
    EXPECT_EQ(pub.tiers[t].tier, tier_name(tier));
    EXPECT_EQ(pub.tiers[t].peak, r.measured.peak_total(tier));
    EXPECT_EQ(pub.tiers[t].predicted, r.predicted.total(tier));
    for (size_t k = 0; k < kNumKinds; ++k) {
      const MemoryUse& use = pub.uses[t * kNumKinds + k];
      EXPECT_EQ(use.kind, kind_name(static_cast<Kind>(k)));
      EXPECT_EQ(use.current, r.measured.current[t][k]) << use.tier << " " << use.kind;
      EXPECT_EQ(use.peak, r.measured.peak[t][k]) << use.tier << " " << use.kind;
      EXPECT_EQ(use.predicted, r.predicted.at(tier, static_cast<Kind>(k)));
      nonzero += use.current > 0;
    }
  }
  EXPECT_GT(nonzero, 2);  // parameters, master copy, optimizer states at least
}

// On a GPU: the plan is made for the GPU's memory (as nvidia-smi counts it), and the
// caching allocator's peak covers every device buffer the ledger counted (the ledger's
// buffers are allocated through it; activations come on top).
TEST(DeviceMemory, GpuPlanUsesTheGpusMemoryAndTheAllocatorPeakCoversTheLedger) {
  if (const std::string why = why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  const MemoryDetail r = one_step_report(c10::Device(c10::kCUDA, 0));
  if (const int64_t smi = nvidia_smi_total(); smi > 0) {
    EXPECT_NEAR(static_cast<double>(r.device_capacity), static_cast<double>(smi), 0.02 * smi);
  }
  ASSERT_TRUE(r.allocator.has_value());
  const int64_t ledger_peak = r.measured.tier_peaks[static_cast<size_t>(Tier::Device)];
  EXPECT_GT(ledger_peak, 0);
  EXPECT_GE(r.allocator->peak_allocated, ledger_peak);
  EXPECT_GE(r.allocator->peak_reserved, r.allocator->peak_allocated);
  EXPECT_GE(r.allocator->allocated, r.measured.current_total(Tier::Device));
}
