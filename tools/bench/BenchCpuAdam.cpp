// zs bench cpu_adam: CpuAdam's step over a large fp32 shard beside torch's AdamW on the
// same data and beside a STREAM-style triad (the memory-bandwidth limit), in one run.
// An Adam step moves 28 bytes per element (read p, g, m, v; write p, m, v).
#include <algorithm>
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "offload/CpuAdam.h"

namespace {

template <typename F>
double best_seconds(F&& f, int repeats = 5) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::string(argv[1]) == "--json";
  const int64_t n = 32 << 20;  // 32 Mi elements: 128 MB per array, far beyond the caches
  torch::manual_seed(0);
  at::Tensor p = torch::randn({n}), g = torch::randn({n}), m = torch::zeros({n}),
             v = torch::zeros({n});
  zeroshard::CpuAdamStep s;
  s.weight_decay = 0.01f;
  const double ours = best_seconds([&] {
    cpu_adam_step(s, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), n);
  });
  at::Tensor tp = p.clone().set_requires_grad(true);
  tp.mutable_grad() = g.clone();
  torch::optim::AdamW torch_adam({tp}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  const double theirs = best_seconds([&] { torch_adam.step(); });
  // Triad a = b + s * c: 12 bytes per element, the most a streaming kernel can move.
  at::Tensor a = torch::empty({n});
  const double triad = best_seconds([&] { at::add_out(a, p, g, 0.5); });
  const double adam_gbs = 28.0 * n / ours / 1e9;
  const double triad_gbs = 12.0 * n / triad / 1e9;
  if (json) {
    std::cout << nlohmann::json{{"isa", zeroshard::cpu_adam_isa()},
                                {"threads", at::get_num_threads()},
                                {"cpu_adam_seconds", ours},
                                {"torch_adamw_seconds", theirs},
                                {"speedup_vs_torch_adamw", theirs / ours},
                                {"cpu_adam_gb_per_s", adam_gbs},
                                {"triad_gb_per_s", triad_gbs},
                                {"fraction_of_bandwidth", adam_gbs / triad_gbs}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("AdamW step over {} Mi fp32 elements, {} threads, {} kernel\n", n >> 20,
                           at::get_num_threads(), zeroshard::cpu_adam_isa());
  std::cout << fmt::format("  zeroshard CpuAdam   {:8.1f} ms  {:6.1f} GB/s\n", ours * 1e3,
                           adam_gbs);
  std::cout << fmt::format("  torch AdamW         {:8.1f} ms  ({:.2f}x CpuAdam's time)\n",
                           theirs * 1e3, theirs / ours);
  std::cout << fmt::format(
      "  triad (bandwidth)   {:8.1f} ms  {:6.1f} GB/s; CpuAdam reaches "
      "{:.0f}% of it\n",
      triad * 1e3, triad_gbs, 100 * adam_gbs / triad_gbs);
  return 0;
}
