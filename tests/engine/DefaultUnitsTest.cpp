// engine/DefaultUnits: the stage-3 units a model gets when none are declared.
#include "engine/DefaultUnits.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace zeroshard;

namespace {
// The same model and expectation as tests/python/test_default_units.py: one rule in both
// languages.
struct Nested : torch::nn::Module {
  Nested() {
    embed = register_module("embed", torch::nn::Embedding(16, 8));
    body = register_module("body", std::make_shared<Body>());
    head = register_module("head", torch::nn::Linear(8, 16));
  }
  struct Body : torch::nn::Module {
    Body() {
      small = register_module("small", torch::nn::ModuleList(torch::nn::Linear(8, 8)));
      layers = register_module(
          "layers", torch::nn::ModuleList(
                        torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)),
                        torch::nn::Dropout(0.1), torch::nn::Linear(8, 8)));
      norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    }
    torch::nn::ModuleList small, layers;
    torch::nn::LayerNorm norm{nullptr};
  };
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<Body> body;
  torch::nn::Linear head{nullptr};
};

}  // namespace

TEST(DefaultUnits, AreTheBlocksWithParametersOfTheLargestStack) {
  Nested model;
  const auto units = default_units(model);
  // layers (216 parameters) beats small (72) and the Sequential inside it; the Dropout
  // has nothing to shard; embed, norm and head stay in the root groups.
  ASSERT_EQ(units.size(), 2u);
  EXPECT_EQ(units[0].get(), model.body->layers[0].get());
  EXPECT_EQ(units[1].get(), model.body->layers[2].get());
}

TEST(DefaultUnits, AModelWithoutAStackHasNone) {
  torch::nn::Linear linear(4, 4);
  EXPECT_TRUE(default_units(*linear).empty());
  torch::nn::Sequential seq(torch::nn::Linear(4, 4), torch::nn::ReLU(), torch::nn::Linear(4, 4));
  EXPECT_EQ(default_units(*seq).size(), 2u);  // the root is the stack
}
