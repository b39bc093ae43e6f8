// engine/UnitPartition: which parameters stage 3 gathers together, and where.
#include "engine/UnitPartition.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/Error.h"

using namespace zeroshard;

namespace {

// The same model and expectation as tests/python/test_unit_partition.py: one rule in both
// languages. A parameter of the root's own, an embedding tied to the head, two stacks of
// blocks (a Dropout without parameters among them), a ModuleList of ModuleLists, a
// ParameterList read by its parent's forward, and a final norm.
struct Body : torch::nn::Module {
  Body() {
    small = register_module("small", torch::nn::ModuleList(torch::nn::Linear(8, 8)));
    layers = register_module(
        "layers", torch::nn::ModuleList(
                      torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)),
                      torch::nn::Dropout(0.1), torch::nn::Linear(8, 8)));
    grid = register_module("grid", torch::nn::ModuleList());
    grid->push_back(torch::nn::ModuleList(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)));
    extras = register_module("extras", torch::nn::ParameterList());
    extras->append(torch::ones({8}));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  }
  torch::nn::ModuleList small, layers, grid;
  torch::nn::ParameterList extras;
  torch::nn::LayerNorm norm{nullptr};
};

// An output layer whose weight is the embedding's (registered under its own name too).
struct TiedHead : torch::nn::Module {
  explicit TiedHead(const at::Tensor& embedding) {
    weight = register_parameter("weight", embedding);
    bias = register_parameter("bias", torch::zeros({embedding.size(0)}));
  }
  at::Tensor weight, bias;
};

struct Nested : torch::nn::Module {
  Nested() {
    scale = register_parameter("scale", torch::ones({1}));
    embed = register_module("embed", torch::nn::Embedding(16, 8));
    body = register_module("body", std::make_shared<Body>());
    head = register_module("head", std::make_shared<TiedHead>(embed->weight));
  }
  at::Tensor scale;
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<Body> body;
  std::shared_ptr<TiedHead> head;
};

struct Named {
  std::vector<const torch::nn::Module*> modules;
  std::vector<std::string> params;
};

std::vector<Named> units_of(const torch::nn::Module& model,
                            const std::vector<const torch::nn::Module*>& declared = {}) {
  const ModuleTree tree = module_tree(model);
  std::vector<size_t> nodes;
  for (const auto* d : declared)
    nodes.push_back(std::find(tree.modules.begin(), tree.modules.end(), d) - tree.modules.begin());
  std::vector<Named> out;
  for (const auto& u : partition_units(tree.nodes, tree.params.size(), nodes)) {
    Named n;
    for (size_t m : u.modules) n.modules.push_back(tree.modules[m]);
    for (size_t p : u.params) n.params.push_back(tree.params[p].name);
    out.push_back(n);
  }
  return out;
}

using Modules = std::vector<const torch::nn::Module*>;
using Names = std::vector<std::string>;

}  // namespace

TEST(UnitPartition, EveryStacksBlocksAndEveryParameterLeftOver) {
  Nested model;
  Body& body = *model.body;
  const auto units = units_of(model);
  ASSERT_EQ(units.size(), 9u);
  EXPECT_EQ(units[0].modules, Modules{&model});  // its own parameter
  EXPECT_EQ(units[0].params, Names{"scale"});
  // The head tied to the embedding: one unit, gathered where either runs.
  EXPECT_EQ(units[1].modules, (Modules{model.embed.get(), model.head.get()}));
  EXPECT_EQ(units[1].params, (Names{"embed.weight", "head.bias"}));
  EXPECT_EQ(units[2].modules, Modules{body.small[0].get()});
  EXPECT_EQ(units[3].modules, Modules{body.layers[0].get()});  // the Sequential, whole
  EXPECT_EQ(units[3].params, (Names{"body.layers.0.0.weight", "body.layers.0.0.bias",
                                    "body.layers.0.1.weight", "body.layers.0.1.bias"}));
  EXPECT_EQ(units[4].modules, Modules{body.layers[2].get()});  // the Dropout has nothing
  const auto& inner = *body.grid[0]->as<torch::nn::ModuleList>();
  EXPECT_EQ(units[5].modules, Modules{inner[0].get()});  // a list in a list is a stack
  EXPECT_EQ(units[6].modules, Modules{inner[1].get()});
  // A ParameterList has no forward: its parent's gathers it.
  EXPECT_EQ(units[7].modules, Modules{&body});
  EXPECT_EQ(units[7].params, Names{"body.extras.0"});
  EXPECT_EQ(units[8].modules, Modules{body.norm.get()});
}

TEST(UnitPartition, DeclaredUnitsAndTheInnermostWins) {
  Nested model;
  Body& body = *model.body;
  // The body as a unit, and one of its blocks inside it: the block keeps its parameters.
  const auto units = units_of(model, {&body, body.layers[2].get()});
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].params, Names{"scale"});
  EXPECT_EQ(units[1].modules, (Modules{model.embed.get(), model.head.get()}));
  EXPECT_EQ(units[2].modules, Modules{&body});
  EXPECT_EQ(units[2].params.size(), 13u);  // everything under it (15) but layers.2's 2
  EXPECT_EQ(units[3].modules, Modules{body.layers[2].get()});
  EXPECT_EQ(units[3].params, (Names{"body.layers.2.weight", "body.layers.2.bias"}));
}

TEST(UnitPartition, AModelWithoutAStackIsOneUnit) {
  torch::nn::Linear linear(4, 4);
  const auto units = units_of(*linear);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].modules, Modules{linear.get()});
  torch::nn::Sequential seq(torch::nn::Linear(4, 4), torch::nn::ReLU(), torch::nn::Linear(4, 4));
  EXPECT_EQ(units_of(*seq).size(), 2u);  // the root is the stack
}

TEST(UnitPartition, ATreeThatPointsNowhereIsAnError) {
  std::vector<ModuleNode> tree(1);
  tree[0].children = {3};
  EXPECT_THROW(partition_units(tree, 0), Error);
  tree[0].children = {};
  tree[0].params = {2};
  EXPECT_THROW(partition_units(tree, 1), Error);
}

// weight_quantization's weights: those of Linear and Embedding modules (the embedding once,
// though the head reads it too), never a bias, a norm, or a parameter of a module of one's own.
TEST(UnitPartition, OnlyLinearAndEmbeddingWeightsAreQuantizable) {
  Nested model;
  Names quantizable;
  for (const NamedParam& p : module_tree(model).params)
    if (p.quantizable) quantizable.push_back(p.name);
  EXPECT_EQ(quantizable, (Names{"embed.weight", "body.small.0.weight", "body.layers.0.0.weight",
                                "body.layers.0.1.weight", "body.layers.2.weight",
                                "body.grid.0.0.weight", "body.grid.0.1.weight"}));
}
