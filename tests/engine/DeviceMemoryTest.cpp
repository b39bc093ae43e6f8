// The device tier's size and the GPU allocator's counts (engine/DeviceMemory.h), and
// memory_report() showing both beside the ledger. One process, world size 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "engine/DeviceMemory.h"
#include "engine/Engine.h"
#include "engine/NcclGroup.h"

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

MemoryReport one_step_report(const c10::Device& device) {
  torch::manual_seed(0);
  auto model = std::make_shared<Mlp>();
  model->to(device);
  Config c;
  c.zero.stage = 2;
  Engine engine(model, c);
  const at::Tensor x = torch::randn({64, 256}, torch::TensorOptions().device(device));
  engine.backward(model->forward(x).square().mean());
  engine.step();
  return engine.memory_report();
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
  const MemoryReport r = one_step_report(c10::Device(c10::kCPU));
  EXPECT_EQ(r.device_capacity, mem_total());
  EXPECT_FALSE(r.allocator.has_value());
  EXPECT_NE(r.to_string().find("device capacity planned with: " + std::to_string(mem_total())),
            std::string::npos)
      << r.to_string();
}

// On a GPU: the plan is made for the GPU's memory (as nvidia-smi counts it), and the
// caching allocator's peak covers every device buffer the ledger counted (the ledger's
// buffers are allocated through it; activations come on top).
TEST(DeviceMemory, GpuPlanUsesTheGpusMemoryAndTheAllocatorPeakCoversTheLedger) {
  if (const std::string why = why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  const MemoryReport r = one_step_report(c10::Device(c10::kCUDA, 0));
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
