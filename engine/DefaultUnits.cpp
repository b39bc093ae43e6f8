#include "engine/DefaultUnits.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

namespace zeroshard {
namespace {

bool is_stack(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr;
}

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace

std::vector<std::shared_ptr<torch::nn::Module>> default_units(const torch::nn::Module& root) {
  // Pre-order, the root first: a stack holding another stack wins over it.
  const torch::nn::Module* largest = is_stack(root) ? &root : nullptr;
  int64_t largest_count = largest != nullptr ? parameter_count(root) : -1;
  for (const auto& m : root.modules(/*include_self=*/false)) {
    if (!is_stack(*m)) continue;
    const int64_t count = parameter_count(*m);
    if (count > largest_count) largest = m.get(), largest_count = count;
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  if (largest == nullptr) return units;
  for (const auto& block : largest->children())
    if (parameter_count(*block) > 0) units.push_back(block);
  return units;
}

}  // namespace zeroshard
