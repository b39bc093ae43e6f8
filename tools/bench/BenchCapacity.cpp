// zs bench capacity: the largest model this machine can train. zeroshard steps a
// GPT-style model of (by default) 3 billion parameters on one rank with ZeRO-3, the
// parameters and the optimizer state on NVMe (nvme_path = --dir), fp32, a few steps
// on one fixed batch (so the loss must fall). Then torch DDP + AdamW (Python, gloo,
// one rank) is tried on the same family of models, growing, until a step fails; both
// run under the same address-space limit (the machine's RAM) so neither can lean on
// swap. Prints both sizes and their ratio.
// usage: zs-bench-capacity [--json] [--dir DIR] [--params N] [--steps N] [--no-ddp]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "common/Bytes.h"
#include "common/Files.h"
#include "engine/EngineImpl.h"
#include "offload/SwapFile.h"
#include "tools/bench/BenchArgs.h"
#include "tools/bench/BenchGpt.h"

using namespace zeroshard;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kDim = 2560, kHeads = 20, kVocab = 2048, kSeq = 64;

int64_t gpt_params(int64_t layers) {
  // Per block: attention 4 d^2 + 4d, MLP 8 d^2 + 5d, two LayerNorms 4d; embedding
  // (tied head) v d; final norm 2d.
  return layers * (12 * kDim * kDim + 13 * kDim) + kVocab * kDim + 2 * kDim;
}

int64_t layers_for(int64_t params) {
  int64_t layers = 1;
  while (gpt_params(layers) < params) ++layers;
  return layers;
}

int64_t host_ram() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

void limit_address_space(int64_t bytes) {
  rlimit r{static_cast<rlim_t>(bytes), static_cast<rlim_t>(bytes)};
  setrlimit(RLIMIT_AS, &r);
}

double rss_gib() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f != nullptr && std::fscanf(f, "%ld %ld", &pages, &resident) == 2) std::fclose(f);
  return resident * static_cast<double>(sysconf(_SC_PAGE_SIZE)) / (1 << 30);
}

nlohmann::json ddp_largest(int64_t limit, int64_t max_params) {
  const std::string cmd = fmt::format(
      "'{}' tools/bench/ddp_capacity.py --dim {} --heads {} --vocab {} --seq {} "
      "--address-limit {} --max-params {}",
      ZS_PYTHON_EXECUTABLE, kDim, kHeads, kVocab, kSeq, limit, max_params);
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  pclose(pipe);
  const auto brace = out.rfind("\n{");
  return nlohmann::json::parse(brace == std::string::npos ? out : out.substr(brace + 1));
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, ddp = true;
  std::string dir = "build/bench-capacity";
  int64_t params = 3'000'000'000;
  int steps = 3;
  try {
    zeroshard::bench::BenchArgs()
        .flag("--json", &json)
        .option("--dir", &dir)
        .option("--params", &params)
        .option("--steps", &steps)
        .flag("--no-ddp", &ddp, false)
        .parse(argc, argv);
    fs::create_directories(dir);
    const int64_t limit = host_ram();
    // fp32 parameters (4 bytes) + master, m, v (12) on NVMe, plus 2% for alignment.
    const int64_t free = free_bytes(dir);
    const int64_t fits = static_cast<int64_t>(free / 16.5) - (1 << 26);
    if (fits < params) {
      std::cerr << fmt::format(
          "{} has {} free: room for about {:.2f}B parameters at 16 bytes each on NVMe, not "
          "{:.2f}B; running {:.2f}B\n",
          dir, format_gib(free), fits / 1e9, params / 1e9, fits / 1e9);
      params = fits;
    }
    const int64_t layers = layers_for(params);
    params = gpt_params(layers);
    limit_address_space(limit);
    at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
    Config c;
    c.zero.stage = 3;
    c.zero.offload_optimizer.device = OffloadDevice::Nvme;
    c.zero.offload_param.device = OffloadDevice::Nvme;
    c.zero.offload_optimizer.nvme_path = c.zero.offload_param.nvme_path = dir;
    c.zero.offload_param.max_in_cpu = 0;
    c.zero.sub_group_size = 50'000'000;
    c.zero.stage3_prefetch_bucket_size = 0;
    c.zero.stage3_max_live_parameters = 2 * 12 * kDim * kDim;
    c.aio.queue_depth = 32;
    c.optimizer.lr = 2e-5;
    c.optimizer.weight_decay = 0.0;
    bench::GptShape shape;
    shape.vocab = kVocab;
    shape.dim = kDim;
    shape.heads = kHeads;
    shape.layers = layers;
    shape.seq = kSeq;
    std::vector<double> losses;
    {  // the Engine and the model are gone before DDP runs
      const auto t0 = std::chrono::steady_clock::now();
      torch::manual_seed(0);
      auto model = std::make_shared<bench::Gpt>(shape);
      EngineOptions options;
      options.units = model->blocks();
      EngineImpl engine(model, c, options);
      const double setup =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!json) {
        std::cout << fmt::format(
            "zeroshard: {:.3f}B parameters ({} layers x d {}), ZeRO-3, parameters and optimizer "
            "state on NVMe under {}; set-up {:.0f} s\n",
            params / 1e9, layers, kDim, dir, setup);
      }
      auto run_unit = [&](const torch::nn::Module& u, const std::function<at::Tensor()>& f) {
        return engine.run_unit(u, f);
      };
      auto gen = at::detail::createCPUGenerator(1);
      const at::Tensor tokens = at::randint(kVocab, {1, kSeq + 1}, gen);
      for (int step = 0; step < steps; ++step) {
        const auto s0 = std::chrono::steady_clock::now();
        at::Tensor loss = model->loss(tokens, run_unit);
        losses.push_back(loss.item<double>());
        engine.backward(loss);
        engine.step();
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
        const auto snap = engine.ledger().snapshot();
        if (!json) {
          std::cout << fmt::format(
              "  step {}  loss {:.4f}  {:.1f} s  RSS {:.2f} GiB  ledger: host {} nvme {}\n", step,
              losses.back(), secs, rss_gib(), format_gib(snap.current_total(Tier::Host)),
              format_gib(snap.current_total(Tier::Nvme)));
        }
      }
    }
    bool falling = true;
    for (size_t i = 1; i < losses.size(); ++i)
      falling = falling && std::isfinite(losses[i]) && losses[i] < losses[i - 1];
    nlohmann::json result{{"largest_params", params}, {"losses", losses}, {"loss_falls", falling}};
    if (ddp) {
      const auto d = ddp_largest(limit, params);
      result["ddp_largest_params"] = d["largest_params"];
      result["ddp_tried"] = d["tried"];
      result["ratio"] = params / std::max(1.0, d["largest_params"].get<double>());
    }
    if (json) {
      std::cout << result.dump(2) << "\n";
    } else if (ddp) {
      std::cout << fmt::format(
          "torch DDP + AdamW (fp32, same model family, same address-space limit {} GiB): largest "
          "that steps {:.3f}B\nzeroshard trains {:.2f}x the parameters DDP can on this machine; "
          "loss {}\n",
          format_gib(limit), result["ddp_largest_params"].get<double>() / 1e9,
          result["ratio"].get<double>(), falling ? "falls every step" : "does NOT fall every step");
    }
    return falling ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "zs-bench-capacity: " << e.what() << "\n";
    return 1;
  }
}
