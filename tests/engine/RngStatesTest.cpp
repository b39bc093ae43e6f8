#include "engine/RngStates.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

namespace zeroshard {
namespace {

TEST(RngStates, OnTheCpuTheCpuStreamAloneComesBack) {
  torch::manual_seed(7);
  const RngStates saved = rng_states_of(c10::Device(c10::kCPU));
  EXPECT_EQ(saved.device_bytes, 0);
  EXPECT_EQ(static_cast<int64_t>(saved.bytes.size()),
            at::detail::getDefaultCPUGenerator().get_state().numel());
  const at::Tensor first = torch::rand({8});
  torch::manual_seed(99);  // another stream in between
  restore_rng_states(saved, c10::Device(c10::kCPU));
  EXPECT_TRUE(torch::equal(torch::rand({8}), first));
}

// A checkpoint written on a GPU keeps the device's stream after the CPU's; on the CPU
// that part is left out and the CPU's still comes back.
TEST(RngStates, ADeviceStreamSavedOnAGpuIsLeftOutOnTheCpu) {
  torch::manual_seed(3);
  RngStates saved = rng_states_of(c10::Device(c10::kCPU));
  const at::Tensor first = torch::rand({4});
  saved.bytes += std::string(16, '\x01');  // a GPU generator's seed and offset
  saved.device_bytes = 16;
  torch::manual_seed(5);
  restore_rng_states(saved, c10::Device(c10::kCPU));
  EXPECT_TRUE(torch::equal(torch::rand({4}), first));
}

TEST(RngStates, ADeviceStateLargerThanTheWholeIsRefused) {
  const RngStates bad{std::string(8, '\0'), 9};
  try {
    restore_rng_states(bad, c10::Device(c10::kCPU));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_STREQ(e.what(), "checkpoint: device RNG state of 9 bytes in 8");
  }
}

}  // namespace
}  // namespace zeroshard
