// What a step reads when no backward came since the last one: zero gradients, at every
// stage, with the optimizer on the device or in host memory. zero() leaves the reduced
// gradients' buffers to be overwritten by the next backward (sharding/GradReducer.h), so
// a step without that backward must still see zeros, not the last step's gradients.
// One process, world size 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/EngineImpl.h"

using namespace zeroshard;

namespace {

// Two blocks (stage-3 units) and a head (a unit of its own).
struct TwoBlockMlp : torch::nn::Module {
  TwoBlockMlp() {
    blocks = register_module("blocks", torch::nn::ModuleList());
    blocks->push_back(torch::nn::Linear(16, 32));
    blocks->push_back(torch::nn::Linear(32, 16));
    head = register_module("head", torch::nn::Linear(16, 8));
  }
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Linear head{nullptr};
};

at::Tensor loss_of(TwoBlockMlp& m, EngineImpl& engine, at::Tensor x) {
  for (auto& block : *m.blocks) {
    x = engine.run_unit(*block,
                        [&] { return torch::relu(block->as<torch::nn::Linear>()->forward(x)); });
  }
  return engine.run_unit(*m.head, [&] { return m.head->forward(x); }).square().mean();
}

// Two steps: a real one, then either a step with no backward before it, or one after a
// backward of a loss times zero (gradients exactly zero). The parameters after both.
std::vector<at::Tensor> train(int stage, const std::string& offload, bool second_backward) {
  torch::manual_seed(0);
  auto model = std::make_shared<TwoBlockMlp>();
  Config c;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 300;                // several groups
  c.zero.stage3_param_persistence_threshold = 0;  // every parameter sharded
  if (offload == "cpu") c.zero.offload_optimizer.device = OffloadDevice::Cpu;
  c.optimizer.weight_decay = 0.1;
  EngineImpl engine(model, c);
  const at::Tensor x = torch::randn({4, 16});
  engine.backward(loss_of(*model, engine, x));
  EXPECT_TRUE(engine.step());
  engine.zero_grad();
  if (second_backward) engine.backward(loss_of(*model, engine, x) * 0);
  EXPECT_TRUE(engine.step());
  std::vector<at::Tensor> out;
  for (const NamedParam& p : engine.full_parameters()) out.push_back(p.param.clone());
  return out;
}

}  // namespace

TEST(EngineStep, AStepWithNoBackwardSinceTheLastStepsWithZeroGradients) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string offload : {"none", "cpu"}) {
      if (stage == 0 && offload == "cpu") continue;  // offload needs stage >= 1
      SCOPED_TRACE("stage " + std::to_string(stage) + " offload_optimizer " + offload);
      const auto without = train(stage, offload, false);
      const auto with_zeros = train(stage, offload, true);
      ASSERT_EQ(without.size(), with_zeros.size());
      for (size_t i = 0; i < without.size(); ++i) {
        EXPECT_TRUE(at::equal(without[i], with_zeros[i])) << "parameter " << i;
      }
    }
  }
}
