// zs bench adam: CpuAdam's step over 100M fp32 parameters beside torch's AdamW on the
// same data and beside a loop with the same memory traffic and no math (the bandwidth
// limit), in one run. An Adam step moves 28 bytes per element (read p, g, m, v; write
// p, m, v).
#include <algorithm>
#include <chrono>
#include <thread>

#include <omp.h>
#include <iostream>

#include <fmt/format.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "offload/CpuAdam.h"
#include "tools/bench/BestSeconds.h"

namespace {

// Adam's memory traffic with next to no arithmetic: read p, g, m, v; write p, m, v.
// What a step over these arrays cannot beat on this machine.
void same_traffic(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    p[i] = p[i] * 0.5f + g[i];
    m[i] = m[i] * 0.5f + g[i];
    v[i] = v[i] * 0.5f + g[i];
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::string(argv[1]) == "--json";
  const int64_t n = 100'000'000;  // 400 MB per array, far beyond the caches
  // The same cores for all three, whatever LibTorch and OpenMP default to.
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(threads);
  omp_set_num_threads(threads);
  torch::manual_seed(0);
  at::Tensor p = torch::randn({n}), g = torch::randn({n}), m = torch::zeros({n}),
             v = torch::zeros({n});
  zeroshard::CpuAdamStep s;
  s.hyper.weight_decay = 0.01;
  const double ours = zeroshard::bench::best_seconds([&] {
    cpu_adam_step(s, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), n);
  });
  at::Tensor bf16 = at::empty({n}, at::kBFloat16);
  const double with_bf16 = zeroshard::bench::best_seconds([&] {
    cpu_adam_step(s, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), n,
                  reinterpret_cast<uint16_t*>(bf16.data_ptr<at::BFloat16>()));
  });
  // The gradient norm: read in Adam's own pass, or in a pass of its own after it.
  double squares = 0;
  const double fused_norm = zeroshard::bench::best_seconds([&] {
    squares = 0;
    cpu_adam_step(s, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), n, nullptr, &squares);
  });
  const double separate_norm = zeroshard::bench::best_seconds([&] {
    cpu_adam_step(s, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), n);
    squares = g.norm().item<double>();
  });
  at::Tensor tp = p.clone().set_requires_grad(true);
  tp.mutable_grad() = g.clone();
  torch::optim::AdamW torch_adam({tp}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  const double theirs = zeroshard::bench::best_seconds([&] { torch_adam.step(); });
  const double limit = zeroshard::bench::best_seconds([&] {
    same_traffic(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                 n);
  });
  const double adam_gbs = 28.0 * n / ours / 1e9;
  const double limit_gbs = 28.0 * n / limit / 1e9;
  if (json) {
    std::cout << nlohmann::json{{"isa", zeroshard::cpu_adam_isa()},
                                {"threads", at::get_num_threads()},
                                {"cpu_adam_seconds", ours},
                                {"torch_adamw_seconds", theirs},
                                {"params", n},
                                {"speedup_vs_torch", theirs / ours},
                                {"cpu_adam_gb_per_s", adam_gbs},
                                {"bandwidth_limit_gb_per_s", limit_gbs},
                                {"fraction_of_bandwidth_limit", adam_gbs / limit_gbs},
                                {"cpu_adam_bf16_seconds", with_bf16},
                                {"bf16_copy_overhead", with_bf16 / ours - 1},
                                {"cpu_adam_norm_in_pass_seconds", fused_norm},
                                {"cpu_adam_then_norm_pass_seconds", separate_norm}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("AdamW step over {}M fp32 parameters, {} threads, {} kernel\n",
                           n / 1'000'000, at::get_num_threads(), zeroshard::cpu_adam_isa());
  std::cout << fmt::format("  zeroshard CpuAdam   {:8.1f} ms  {:6.1f} GB/s\n", ours * 1e3,
                           adam_gbs);
  std::cout << fmt::format(
      "  CpuAdam + bf16 copy {:8.1f} ms  (+{:.1f}% for writing the bf16 parameters)\n",
      with_bf16 * 1e3, 100 * (with_bf16 / ours - 1));
  std::cout << fmt::format(
      "  CpuAdam + gradient norm in its pass {:8.1f} ms (+{:.1f}%); with a norm pass of its own "
      "{:8.1f} ms (+{:.1f}%)\n",
      fused_norm * 1e3, 100 * (fused_norm / ours - 1), separate_norm * 1e3,
      100 * (separate_norm / ours - 1));
  std::cout << fmt::format("  torch AdamW         {:8.1f} ms  ({:.2f}x CpuAdam's time)\n",
                           theirs * 1e3, theirs / ours);
  std::cout << fmt::format(
      "  same traffic, no math {:6.1f} ms  {:6.1f} GB/s (the bandwidth limit); CpuAdam "
      "reaches {:.0f}% of it\n",
      limit * 1e3, limit_gbs, 100 * adam_gbs / limit_gbs);
  return 0;
}
