// The optimizer types a LibTorch program's engine takes: those zeroshard steps itself.
#include <fstream>

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "zeroshard/Engine.h"

#include "common/Error.h"
#include "tests/offload/Scratch.h"

using namespace zeroshard;
using namespace zeroshard::testing;

// A LibTorch program has no one to step a torch.optim class: Engine::create says so, on
// every rank before any waits for the others, not at the first step.
TEST(ExternalOptimizer, ALibTorchEngineRefusesATorchOptimizerTypeWhenCreated) {
  const std::string path = scratch_dir("external-libtorch") + "/sgd.json";
  std::ofstream(path) << R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}})";
  try {
    Engine::create(std::make_shared<torch::nn::LinearImpl>(4, 4), path);
    FAIL() << "an engine was made for torch.optim.SGD";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sgd.json: config key 'optimizer.type' is 'SGD', a "
                                         "torch.optim class, which the Python package steps "
                                         "(zeroshard.initialize); allowed in a LibTorch program: "
                                         "Adam, AdamW or Lamb"),
              std::string::npos)
        << e.what();
  }
}
