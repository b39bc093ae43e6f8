// One rank of a multi-rank test: trains a TestModel with zeroshard::Engine and writes
// the final parameters (fp32, in registration order) and per-step statistics.
// usage: engine_worker OUT_PREFIX key=value...
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include <torch/serialize.h>

#include "engine/EngineImpl.h"
#include "tests/engine/TestModels.h"

using namespace zeroshard;
using namespace zeroshard::testing;

int main(int argc, char** argv) {
  try {
    const std::string out = argv[1];
    const Scenario s = Scenario::parse({argv + 2, argv + argc});
    auto model = make_model(s);
    EngineOptions options;
    options.units = model->units();
    EngineImpl engine(model, s.config(), options);
    model->run_unit = [&engine](const torch::nn::Module& unit,
                                const std::function<at::Tensor()>& forward) {
      return engine.run_unit(unit, forward);
    };
    const int64_t per_rank = s.batch / engine.world_size();
    const int64_t begin = engine.rank() * per_rank;
    std::vector<double> stats;  // per step: stepped, loss scale, grad norm, loss
    for (int step = 0; step < s.steps; ++step) {
      bool stepped = false;
      double loss_sum = 0;
      for (int micro = 0; micro < s.accum; ++micro) {
        at::Tensor loss = model->loss(step, micro, begin, begin + per_rank);
        loss_sum += loss.item<double>();
        if (step == s.overflow_at && micro == 0)
          loss = loss * std::numeric_limits<float>::infinity();
        if (step == s.die_at && engine.rank() == engine.world_size() - 1) {
          std::fprintf(stderr, "rank %d exits on purpose in step %d\n", engine.rank(), step);
          _exit(3);  // no cleanup, as a crash or SIGKILL would leave it
        }
        engine.backward(loss);
        stepped = engine.step();
      }
      stats.insert(stats.end(), {stepped ? 1.0 : 0.0, engine.loss_scale(),
                                 engine.global_grad_norm(), loss_sum / s.accum});
    }
    std::vector<at::Tensor> params;
    for (const auto& p : engine.full_parameters())
      params.push_back(p.param.to(at::kCPU, at::kFloat));
    std::vector<at::Tensor> buffers{at::zeros({0})};
    for (const auto& b : model->buffers()) buffers.push_back(b.to(at::kCPU, at::kFloat).view({-1}));
    params.push_back(at::cat(buffers));
    params.push_back(at::tensor(stats, at::kDouble));
    const auto report = engine.memory_detail();
    std::vector<double> memory;
    // tiers x kinds x (current, predicted, peak)
    for (size_t t = 0; t < kNumTiers; ++t) {
      for (size_t k = 0; k < kNumKinds; ++k) {
        memory.push_back(static_cast<double>(report.measured.current[t][k]));
        memory.push_back(
            static_cast<double>(report.predicted.at(static_cast<Tier>(t), static_cast<Kind>(k))));
        memory.push_back(static_cast<double>(report.measured.peak[t][k]));
      }
    }
    params.push_back(at::tensor(memory, at::kDouble));
    torch::save(params, out + ".rank" + std::to_string(engine.rank()) + ".pt");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "engine_worker: " << e.what() << "\n";
    return 1;
  }
}
