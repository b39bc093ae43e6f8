// zs bench sharding: a GPT-style model trained on N local ranks at ZeRO stages 0-3.
// Prints, per stage, step time, bytes sent per step and model-state bytes per rank,
// each beside stage 0 measured in the same run (ratios, since absolute times drift).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "common/Error.h"
#include "engine/EngineImpl.h"
#include "tools/bench/BenchArgs.h"
#include "tools/bench/BenchGpt.h"
#include "tools/launch/RankLauncher.h"

namespace zeroshard::bench {
namespace {

struct Options {
  std::vector<int> stages{0, 1, 2, 3};
  int ranks = 2;
  int steps = 6;
  int warmup = 2;
  int batch = 4;  // per rank
  bool json = false;
  GptShape shape;
  // Offload, as `zero_optimization.offload_*.device` (bench peers' offload rows).
  std::string offload_optimizer = "none";
  std::string offload_param = "none";
  std::string nvme_path = "/tmp";
  std::string overlap_step = "auto";  // offload_optimizer.overlap_step
  double clip = 1.0;                  // gradient_clipping (0 lets overlap_step be on)
};

OffloadDevice offload_device(const std::string& option, const std::string& value) {
  if (value == "none") return OffloadDevice::None;
  if (value == "cpu") return OffloadDevice::Cpu;
  if (value == "nvme") return OffloadDevice::Nvme;
  fail("{}: '{}' is not a device; allowed: none, cpu, nvme", option, value);
}

std::vector<int> parse_stages(const std::string& list) {
  std::vector<int> stages;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) stages.push_back(std::stoi(item));
  return stages;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

Options parse(int argc, char** argv, int first) {
  Options o;
  BenchArgs()
      .flag("--json", &o.json)
      .option("--ranks", &o.ranks)
      .option("--steps", &o.steps)
      .option("--layers", &o.shape.layers)
      .option("--dim", &o.shape.dim)
      .option("--batch", &o.batch)
      .option("--stages", "0,2,3", [&o](const std::string& v) { o.stages = parse_stages(v); })
      .option("--offload-optimizer", &o.offload_optimizer, "none|cpu|nvme")
      .option("--offload-param", &o.offload_param, "none|cpu|nvme")
      .option("--nvme-path", &o.nvme_path)
      .option("--overlap-step", &o.overlap_step, "auto|true|false")
      .option("--clip", "X", [&o](const std::string& v) { o.clip = std::stod(v); })
      .parse(argc, argv, first);
  return o;
}

int64_t block_params(const GptShape& s) {
  return 12 * s.dim * s.dim + 13 * s.dim;
}

// One rank: train, then rank 0 writes its measurements as JSON to `out`.
int worker(int stage, const std::string& out, const Options& o) {
  torch::manual_seed(0);
  auto model = std::make_shared<Gpt>(o.shape);
  Config c;
  c.zero.stage = stage;
  c.zero.overlap_comm = true;
  c.zero.reduce_bucket_size = block_params(o.shape);
  c.zero.allgather_bucket_size = block_params(o.shape);
  c.zero.stage3_prefetch_bucket_size = block_params(o.shape);  // one block ahead
  c.zero.stage3_param_persistence_threshold = 4 * o.shape.dim;
  c.gradient_clipping = o.clip;
  c.zero.offload_optimizer.overlap_step = o.overlap_step;
  c.zero.offload_optimizer.device = offload_device("--offload-optimizer", o.offload_optimizer);
  c.zero.offload_optimizer.nvme_path = o.nvme_path;
  c.zero.offload_param.device = offload_device("--offload-param", o.offload_param);
  c.zero.offload_param.nvme_path = o.nvme_path;
  if (c.zero.offload_param.device == OffloadDevice::Nvme) c.zero.offload_param.max_in_cpu = 0;
  EngineOptions options;
  options.units = model->blocks();
  EngineImpl engine(model, c, options);
  auto run_unit = [&](const torch::nn::Module& unit, const std::function<at::Tensor()>& f) {
    return engine.run_unit(unit, f);
  };
  auto gen = at::detail::createCPUGenerator(100 + engine.rank());
  double last_loss = 0;
  std::vector<double> forward_s, backward_s, step_s, step_seconds;
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto train_step = [&] {
    const at::Tensor tokens = at::randint(o.shape.vocab, {o.batch, o.shape.seq + 1}, gen);
    auto t = Clock::now();
    at::Tensor loss = model->loss(tokens, run_unit);
    forward_s.push_back(since(t));
    last_loss = loss.item<double>();
    t = Clock::now();
    engine.backward(loss);
    backward_s.push_back(since(t));
    t = Clock::now();
    engine.step();
    step_s.push_back(since(t));
  };
  for (int i = 0; i < o.warmup; ++i) train_step();
  forward_s.clear();
  backward_s.clear();
  step_s.clear();
  const int64_t sent_before = engine.bytes_sent();
  const auto start = Clock::now();
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = Clock::now();
    train_step();
    step_seconds.push_back(since(t0));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto snapshot = engine.ledger().snapshot();
  int64_t states = 0;
  for (Kind k :
       {Kind::Params, Kind::MasterParams, Kind::Grads, Kind::GradsFp32, Kind::OptimizerStates}) {
    states += snapshot.current[0][static_cast<size_t>(k)];
  }
  if (engine.rank() == 0) {
    nlohmann::json j;
    j["stage"] = stage;
    j["step_seconds"] = seconds / o.steps;
    j["bytes_sent_per_step"] = (engine.bytes_sent() - sent_before) / o.steps;
    j["model_state_bytes"] = states;
    j["peak_device_bytes"] = snapshot.peak_total(Tier::Device);
    j["median_step_seconds"] = median(step_seconds);
    j["tokens_per_second"] = o.batch * o.shape.seq * engine.world_size() / median(step_seconds);
    j["peak_rss_bytes"] = peak_rss_bytes();
    j["final_loss"] = last_loss;
    j["phase_seconds"] = {
        {"forward", median(forward_s)}, {"backward", median(backward_s)}, {"step", median(step_s)}};
    std::ofstream(out) << j.dump();
  }
  return 0;
}

std::vector<std::string> forward_args(const Options& o) {
  return {"--steps",
          std::to_string(o.steps),
          "--layers",
          std::to_string(o.shape.layers),
          "--dim",
          std::to_string(o.shape.dim),
          "--batch",
          std::to_string(o.batch),
          "--offload-optimizer",
          o.offload_optimizer,
          "--offload-param",
          o.offload_param,
          "--nvme-path",
          o.nvme_path,
          "--overlap-step",
          o.overlap_step,
          "--clip",
          fmt::format("{}", o.clip)};
}

int driver(const std::string& self, const Options& o) {
  std::vector<nlohmann::json> rows;
  for (int stage : o.stages) {
    const std::string out = fmt::format("/tmp/zs_bench_sharding_{}_{}.json", getpid(), stage);
    std::vector<std::string> args{"--worker", std::to_string(stage), out};
    for (const auto& a : forward_args(o)) args.push_back(a);
    const auto result = launch::launch_ranks(o.ranks, self, args, std::chrono::seconds(600));
    if (!result.all_ok()) fail("stage {} failed:\n{}", stage, result.describe());
    std::ifstream in(out);
    rows.push_back(nlohmann::json::parse(in));
    std::remove(out.c_str());
  }
  if (o.json && (o.stages.size() != 4 || o.stages[0] != 0)) {  // rows only, for bench peers
    std::cout << nlohmann::json(rows).dump(2) << "\n";
    return 0;
  }
  const auto& base = rows[0];
  auto ratio = [&](const nlohmann::json& r, const char* key) {
    return r[key].get<double>() / base[key].get<double>();
  };
  if (o.json) {
    nlohmann::json j;
    j["ranks"] = o.ranks;
    j["stages"] = rows;
    j["stage3_time_ratio"] = ratio(rows[3], "step_seconds");
    j["stage3_state_fraction"] = ratio(rows[3], "model_state_bytes");
    j["stage3_bytes_ratio"] = ratio(rows[3], "bytes_sent_per_step");
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("GPT {} layers x {} dim, {} ranks over Gloo, fp32, {} timed steps\n",
                           o.shape.layers, o.shape.dim, o.ranks, o.steps);
  std::cout << fmt::format("{:>5} {:>10} {:>7} {:>13} {:>7} {:>14} {:>8}\n", "stage", "step ms",
                           "x st0", "MB sent/step", "x st0", "state MB/rank", "x st0");
  for (const auto& r : rows) {
    std::cout << fmt::format(
        "{:>5} {:>10.1f} {:>7.2f} {:>13.2f} {:>7.2f} {:>14.2f} {:>8.3f}\n", r["stage"].get<int>(),
        r["step_seconds"].get<double>() * 1e3, ratio(r, "step_seconds"),
        r["bytes_sent_per_step"].get<double>() / 1e6, ratio(r, "bytes_sent_per_step"),
        r["model_state_bytes"].get<double>() / 1e6, ratio(r, "model_state_bytes"));
  }
  std::cout << "theory: bytes sent, stages 1-2 = 1.0x stage 0, stage 3 = 1.5x (parameters "
               "gathered in forward and again in backward); model states at stage 3 = 1/d\n";
  return 0;
}

}  // namespace
}  // namespace zeroshard::bench

int main(int argc, char** argv) {
  using namespace zeroshard;
  try {
    if (argc > 3 && std::string(argv[1]) == "--worker") {
      return bench::worker(std::stoi(argv[2]), argv[3], bench::parse(argc, argv, 4));
    }
    char self[4096] = {0};
    if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) fail("cannot find myself");
    return bench::driver(self, bench::parse(argc, argv, 1));
  } catch (const std::exception& e) {
    std::cerr << "zs-bench-sharding: " << e.what() << "\n";
    return 2;
  }
}
