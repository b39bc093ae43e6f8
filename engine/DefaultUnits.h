#pragma once
// The stage-3 units a model gets when none are declared. One rule in both languages
// (bindings/zeroshard/engine.py's default_units is the Python side, tested alike): the
// blocks of the model's largest stack, a ModuleList or Sequential by parameter count,
// the first one found in pre-order on a tie. Everything else (embeddings, final norm,
// head) is in the root groups, whole on every rank, so a parameter used outside its
// module's forward (a head multiplying by the embedding's weight) is always there.
// Declare units to shard those too, as the benchmarks do (docs/architecture.md).
#include <memory>
#include <vector>

#include <torch/nn/module.h>

namespace zeroshard {

std::vector<std::shared_ptr<torch::nn::Module>> default_units(const torch::nn::Module& root);

}  // namespace zeroshard
