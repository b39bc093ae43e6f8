// CpuAdam against torch's own AdamW/Adam over 100 steps (the 1e-6 bound).
#include "offload/CpuAdam.h"

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace zeroshard;

namespace {

constexpr int64_t kN = 100'003;  // not a multiple of any vector width or chunk

double relative_max_diff(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

// Runs 100 steps of CpuAdam and of `torch_optimizer` on the same gradients.
template <typename TorchOptimizer, typename Options>
void compare(const Options& options, bool decoupled, double lr, double wd) {
  torch::manual_seed(3);
  at::Tensor ours = torch::randn({kN});
  at::Tensor theirs = ours.clone().set_requires_grad(true);
  at::Tensor m = torch::zeros({kN}), v = torch::zeros({kN});
  TorchOptimizer reference({theirs}, options);
  for (int64_t step = 1; step <= 100; ++step) {
    const at::Tensor grad = torch::randn({kN}) * (1.0 / static_cast<double>(step));
    theirs.mutable_grad() = grad.clone();
    reference.step();
    CpuAdamStep s;
    s.hyper.lr = lr;
    s.hyper.weight_decay = wd;
    s.hyper.decoupled = decoupled;
    s.step = step;
    cpu_adam_step(s, ours.data_ptr<float>(), grad.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), kN);
  }
  EXPECT_LE(relative_max_diff(ours, theirs.detach()), 1e-6) << cpu_adam_isa();
}

}  // namespace

TEST(CpuAdam, MatchesTorchAdamWOver100Steps) {
  compare<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1), true, 1e-2, 0.1);
}

TEST(CpuAdam, MatchesTorchAdamWithL2Over100Steps) {
  compare<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).weight_decay(0.1), false, 1e-2, 0.1);
}

TEST(CpuAdam, GradScaleAndBf16CopyInTheSamePass) {
  torch::manual_seed(5);
  const at::Tensor p0 = torch::randn({kN}), grad = torch::randn({kN});
  at::Tensor scaled_p = p0.clone(), m1 = torch::zeros({kN}), v1 = torch::zeros({kN});
  at::Tensor plain_p = p0.clone(), m2 = torch::zeros({kN}), v2 = torch::zeros({kN});
  at::Tensor bf16 = torch::empty({kN}, torch::kBFloat16);
  CpuAdamStep s;
  s.grad_scale = 0.25;
  cpu_adam_step(s, scaled_p.data_ptr<float>(), (grad * 4).contiguous().data_ptr<float>(),
                m1.data_ptr<float>(), v1.data_ptr<float>(), kN,
                reinterpret_cast<uint16_t*>(bf16.data_ptr<at::BFloat16>()));
  s.grad_scale = 1.0;
  cpu_adam_step(s, plain_p.data_ptr<float>(), grad.data_ptr<float>(), m2.data_ptr<float>(),
                v2.data_ptr<float>(), kN);
  EXPECT_TRUE(torch::equal(scaled_p, plain_p));                    // 4 x 0.25 is exact
  EXPECT_TRUE(torch::equal(bf16, scaled_p.to(torch::kBFloat16)));  // torch's own rounding
}

TEST(CpuAdam, Bf16GradientsAreReadAsTheirFp32Values) {
  torch::manual_seed(6);
  const at::Tensor p0 = torch::randn({kN});
  const at::Tensor grad16 = torch::randn({kN}).to(torch::kBFloat16);
  at::Tensor a = p0.clone(), ma = torch::zeros({kN}), va = torch::zeros({kN});
  at::Tensor b = p0.clone(), mb = torch::zeros({kN}), vb = torch::zeros({kN});
  const at::Tensor grad32 = grad16.to(torch::kFloat);  // exact: what the kernel must read
  CpuAdamStep s;
  s.hyper.weight_decay = 0.1;
  for (int64_t step = 1; step <= 3; ++step) {
    s.step = step;
    cpu_adam_step(s, a.data_ptr<float>(),
                  reinterpret_cast<const uint16_t*>(grad16.data_ptr<at::BFloat16>()),
                  ma.data_ptr<float>(), va.data_ptr<float>(), kN);
    cpu_adam_step(s, b.data_ptr<float>(), grad32.data_ptr<float>(), mb.data_ptr<float>(),
                  vb.data_ptr<float>(), kN);
  }
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(ma, mb));
  EXPECT_TRUE(torch::equal(va, vb));
  EXPECT_FALSE(torch::equal(a, p0));
}

// The squared gradients summed in Adam's own pass: torch's sum in double of the same
// values (as read, before grad_scale), added to what the sum held; fp32 and bf16
// gradients; the same to the last bit with 1 thread or 2; the update itself unchanged.
TEST(CpuAdam, SumsTheSquaredGradientsInItsOwnPass) {
  torch::manual_seed(7);
  const at::Tensor p0 = torch::randn({kN}), grad = torch::randn({kN}) * 3;
  const double want = grad.to(torch::kDouble).square().sum().item<double>();
  CpuAdamStep s;
  s.grad_scale = 0.5;
  auto step = [&](int threads, at::Tensor& p, double* squares) {
    set_cpu_adam_threads(threads);
    at::Tensor m = torch::zeros({kN}), v = torch::zeros({kN});
    cpu_adam_step(s, p.data_ptr<float>(), grad.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), kN, nullptr, squares);
  };
  double one = 10.0, two = 10.0;
  at::Tensor a = p0.clone(), b = p0.clone(), c = p0.clone();
  step(1, a, &one);
  step(2, b, &two);
  step(2, c, nullptr);
  set_cpu_adam_threads(at::get_num_threads());
  EXPECT_NEAR(one - 10.0, want, 1e-12 * want);
  EXPECT_EQ(one, two);
  EXPECT_TRUE(torch::equal(a, c));
  EXPECT_TRUE(torch::equal(b, c));

  const at::Tensor grad16 = grad.to(torch::kBFloat16);
  const double want16 = grad16.to(torch::kDouble).square().sum().item<double>();
  double squares16 = 0;
  at::Tensor m = torch::zeros({kN}), v = torch::zeros({kN}), p = p0.clone();
  cpu_adam_step(s, p.data_ptr<float>(),
                reinterpret_cast<const uint16_t*>(grad16.data_ptr<at::BFloat16>()),
                m.data_ptr<float>(), v.data_ptr<float>(), kN, nullptr, &squares16);
  EXPECT_NEAR(squares16, want16, 1e-12 * want16);
}

TEST(CpuAdam, ChoosesAnInstructionSetThisMachineHas) {
  const std::string isa = cpu_adam_isa();
  EXPECT_TRUE(isa == "avx512" || isa == "avx2" || isa == "generic") << isa;
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(isa, "avx512");
  }
}
