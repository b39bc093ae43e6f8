// ResidentOptimizer with torch's fused Adam kernel (what it runs on a GPU) against its
// ATen operations (torch.optim.AdamW's for-loop arithmetic) over 100 steps, on the host,
// where the same fused kernel runs too: AdamW and Adam with L2 decay, a scaled gradient,
// bf16 parameters with fp32 masters, and two parameter groups' spans in one shard.
#include "optim/ResidentOptimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using namespace zeroshard;

namespace {

constexpr int64_t kN = 10'007;

double relative_max_diff(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

void compare(bool decoupled, double grad_scale, at::ScalarType dtype) {
  SCOPED_TRACE(std::string(decoupled ? "AdamW" : "Adam with L2") + ", grad_scale " +
               std::to_string(grad_scale) + ", " + c10::toString(dtype));
  at::manual_seed(11);
  const at::Tensor start = at::randn({kN}).to(dtype);
  MemoryLedger ledger;
  ResidentOptimizer fused(&ledger, fused_adam_kernel()), plain(&ledger);
  AdamHyper first, second;
  first.lr = 1e-2;
  first.weight_decay = 0.1;
  first.decoupled = second.decoupled = decoupled;
  second.lr = 3e-3;  // a second parameter group from element 4,000 on
  second.weight_decay = 0;
  const std::vector<HyperSpan> spans = {{0, 4'000, 0}, {4'000, kN - 4'000, 1}};
  fused.add_group(start.clone(), spans);
  plain.add_group(start.clone(), spans);
  for (int step = 1; step <= 100; ++step) {
    const at::Tensor grad = at::randn({kN}) * (1.0 / step);
    fused.step({grad.clone()}, grad_scale, {first, second});
    plain.step({grad.clone()}, grad_scale, {first, second});
  }
  const auto& a = fused.states().front();
  const auto& b = plain.states().front();
  EXPECT_LE(relative_max_diff(a.master, b.master), 1e-6);
  EXPECT_LE(relative_max_diff(a.m, b.m), 1e-6);
  EXPECT_LE(relative_max_diff(a.v, b.v), 1e-6);
  EXPECT_FALSE(at::equal(a.master, start.to(at::kFloat)));
  EXPECT_TRUE(at::equal(a.shard, a.master.to(dtype)));  // the shard gets the update back
}

}  // namespace

TEST(ResidentOptimizer, FusedKernelStepsAsTheAtenOperationsOver100Steps) {
  compare(true, 1.0, at::kFloat);
  compare(true, 0.25, at::kFloat);
  compare(false, 1.0 / 3, at::kFloat);
  compare(true, 0.5, at::kBFloat16);
}
