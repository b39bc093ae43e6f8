// The demo training run: one rank of a small GPT trained with zeroshard::Engine from a
// YAML config on a task it can learn (each next token is a fixed function of the
// last), so the loss visibly falls. Start it with `./zs run -n 2 zs-demo-train CONFIG`.
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/Bytes.h"
#include "engine/EngineImpl.h"
#include "tools/bench/BenchGpt.h"

using namespace zeroshard;

namespace {

// Sequences where token[i+1] = (5 * token[i] + 3) mod vocab, from random starts.
at::Tensor batch(const bench::GptShape& s, int64_t rows, at::Generator& gen) {
  at::Tensor tokens = at::empty({rows, s.seq + 1}, at::kLong);
  tokens.select(1, 0).copy_(at::randint(s.vocab, {rows}, gen));
  for (int64_t i = 0; i < s.seq; ++i) {
    tokens.select(1, i + 1).copy_((tokens.select(1, i) * 5 + 3).remainder(s.vocab));
  }
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string config_path = argc > 1 ? argv[1] : "configs/zero3.yaml";
    const int steps = argc > 2 ? std::stoi(argv[2]) : 100;
    const LoadedConfig loaded = load_config_file(config_path);
    bench::GptShape shape;
    shape.vocab = 256;
    shape.dim = 128;
    shape.layers = 4;
    shape.heads = 4;
    shape.seq = 32;
    torch::manual_seed(0);
    auto model = std::make_shared<bench::Gpt>(shape);
    EngineOptions options;
    options.units = model->blocks();
    EngineImpl engine(model, loaded.config, options);
    const bool main_rank = engine.rank() == 0;
    if (main_rank) {
      for (const auto& w : loaded.warnings) std::cout << "warning: " << w << "\n";
      std::cout << fmt::format("config {}: {} on {} ranks, {}\n", config_path,
                               engine.plan().option.label(), engine.world_size(),
                               engine.config().bf16 ? "bf16 with fp32 master" : "fp32");
    }
    auto run_unit = [&](const torch::nn::Module& unit, const std::function<at::Tensor()>& f) {
      return engine.run_unit(unit, f);
    };
    auto gen = at::detail::createCPUGenerator(7 + engine.rank());
    const int64_t micro = *engine.config().train_micro_batch_size_per_gpu * 8;
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < steps; ++step) {
      double loss_value = 0;
      for (int64_t m = 0; m < *engine.config().gradient_accumulation_steps; ++m) {
        at::Tensor loss = model->loss(batch(shape, micro, gen), run_unit);
        loss_value = loss.item<double>();
        engine.backward(loss);
        engine.step();
      }
      if (main_rank && (step % 10 == 0 || step == steps - 1)) {
        std::cout << fmt::format("step {:3d}  loss {:.4f}  grad norm {:.3f}  lr {:.2e}\n", step,
                                 loss_value, engine.global_grad_norm(), engine.lr());
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto report = engine.memory_report();  // the public report
    if (main_rank) {
      std::cout << fmt::format(
          "{} steps in {:.1f} s; rank 0 memory (bytes) as measured by the "
          "MemoryLedger beside the Planner's prediction:\n{}",
          steps, seconds, report.to_string());
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "zs-demo-train: " << e.what() << "\n";
    return 1;
  }
}
