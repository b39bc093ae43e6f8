// Trains a small MLP with zeroshard::Engine on every rank the launcher started, and
// checks the result against torch's own AdamW run in this process on every rank's data
// (what DDP would give): exits 1 when a parameter differs by more than 1e-5.
//   zeroshard-example CONFIG [STEPS]
#include <cstdio>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include "zeroshard/Engine.h"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) blocks->push_back(torch::nn::Linear(16, 16));
    head = register_module("head", torch::nn::Linear(16, 1));
  }
  // run_unit: at stage 3 each block's parameters are gathered for its forward only.
  template <class RunUnit>
  at::Tensor forward(at::Tensor x, RunUnit&& run_unit) {
    for (auto& block : *blocks) {
      x = run_unit(*block, [&] { return torch::tanh(block->as<torch::nn::Linear>()->forward(x)); });
    }
    return run_unit(*head, [&] { return head->forward(x); });
  }
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Mlp);

constexpr int64_t kRowsPerRank = 8;
constexpr double kLr = 1e-2, kWeightDecay = 0.01;

// The batch of step `step` for all ranks together; rank r trains on its rows.
std::pair<at::Tensor, at::Tensor> global_batch(int step, int world) {
  torch::manual_seed(1000 + step);
  at::Tensor x = torch::randn({kRowsPerRank * world, 16});
  return {x, x.sum(1, true).sin()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: zeroshard-example CONFIG [STEPS]\n";
    return 2;
  }
  const int steps = argc > 2 ? std::stoi(argv[2]) : 10;
  try {
    torch::manual_seed(0);
    Mlp model;
    torch::manual_seed(0);
    Mlp reference;  // the same initial values

    zeroshard::EngineOptions options;
    zeroshard::ParamGroup group;
    group.params = model->parameters();
    group.options.lr = kLr;
    group.options.weight_decay = kWeightDecay;
    options.param_groups = {group};
    auto engine = zeroshard::Engine::create(model.ptr(), argv[1], options);
    const int rank = engine->rank(), world = engine->world_size();
    auto run_unit = [&](const torch::nn::Module& unit, const std::function<at::Tensor()>& f) {
      return engine->run_unit(unit, f);
    };
    auto plain = [](const torch::nn::Module&, const std::function<at::Tensor()>& f) { return f(); };
    torch::optim::AdamW adamw(reference->parameters(),
                              torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));

    for (int step = 0; step < steps; ++step) {
      auto [x, y] = global_batch(step, world);
      at::Tensor mine = x.narrow(0, rank * kRowsPerRank, kRowsPerRank);
      at::Tensor loss = torch::mse_loss(model->forward(mine, run_unit),
                                        y.narrow(0, rank * kRowsPerRank, kRowsPerRank));
      engine->backward(loss);
      engine->step();
      adamw.zero_grad();
      torch::mse_loss(reference->forward(x, plain), y).backward();
      adamw.step();
      if (rank == 0) std::printf("step %d  loss %.6f\n", step, loss.item<double>());
    }

    double worst = 0;
    auto expected = reference->named_parameters();
    for (const zeroshard::NamedParam& p : engine->full_parameters()) {
      worst = std::max(worst, (p.param - expected[p.name]).abs().max().item<double>());
    }
    if (rank == 0) {
      std::printf("max |engine - torch AdamW| over every parameter: %.3g\n", worst);
      std::cout << engine->memory_report().to_string();
    }
    return worst <= 1e-5 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "zeroshard-example: " << e.what() << "\n";
    return 1;
  }
}
