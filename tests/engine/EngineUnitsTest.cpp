// Stage-3 units in one process (world size 1: no process group, same code paths).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/Error.h"
#include "engine/EngineImpl.h"

using namespace zeroshard;

namespace {

struct Stack : torch::nn::Module {
  Stack() {
    blocks = register_module(
        "blocks", torch::nn::ModuleList(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)));
    head = register_module("head", torch::nn::Linear(8, 1));
  }
  torch::nn::ModuleList blocks;
  torch::nn::Linear head{nullptr};
};

Config stage3() {
  Config c;
  c.zero.stage = 3;
  c.zero.stage3_param_persistence_threshold = 0;
  return c;
}

}  // namespace

TEST(EngineUnits, EveryParameterIsInAUnitAndOnlyShardsStayBetweenSteps) {
  torch::manual_seed(0);
  auto model = std::make_shared<Stack>();
  EngineImpl engine(model, stage3());
  // The blocks of the stack, and the head (left over, a unit of its own): all sharded.
  // One rank: each unit its own shard, padded to 64 elements (blocks 72 -> 128, head 9 -> 64).
  EXPECT_EQ(engine.ledger().current(Tier::Device, Kind::Params), (128 + 128 + 64) * 4);
  at::Tensor h = torch::randn({4, 8});
  for (const auto& block : *model->blocks) {
    auto* linear = block->as<torch::nn::Linear>();
    h = engine.run_unit(*block, [&] { return linear->forward(h); });
  }
  const at::Tensor loss = engine.run_unit(*model->head, [&] { return model->head->forward(h); });
  engine.backward(loss.sum());
  EXPECT_TRUE(engine.step());
  // Between steps only shards are held: no gathered parameters at rest.
  EXPECT_EQ(engine.ledger().current(Tier::Device, Kind::GatheredParams), 0);
  EXPECT_EQ(engine.full_parameters().size(), 6u);
  // Outside run_unit a sharded parameter is not there to be read.
  EXPECT_TRUE(model->head->weight.isnan().all().item<bool>());
}

TEST(EngineUnits, RunningAModuleThatIsNoUnitIsAClearError) {
  auto model = std::make_shared<Stack>();
  EngineImpl engine(model, stage3());
  try {
    engine.run_unit(*model->blocks, [] { return torch::zeros({1}); });
    FAIL() << "accepted a ModuleList that is not a unit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a stage-3 unit"), std::string::npos) << e.what();
  }
}

TEST(EngineUnits, AParameterReadOutsideRunUnitIsAnErrorNotANaNStep) {
  auto model = std::make_shared<Stack>();
  EngineImpl engine(model, stage3());
  at::Tensor h = torch::randn({4, 8});
  for (const auto& block : *model->blocks) {
    auto* linear = block->as<torch::nn::Linear>();
    h = engine.run_unit(*block, [&] { return linear->forward(h); });
  }
  const at::Tensor loss = model->head->forward(h).sum();  // the head's unit never gathered
  try {
    engine.backward(loss);
    FAIL() << "trained on the placeholder";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parameter 'head."), std::string::npos) << what;
    EXPECT_NE(what.find("through Engine::run_unit"), std::string::npos) << what;
  }
}
