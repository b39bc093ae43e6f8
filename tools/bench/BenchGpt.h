#pragma once
// A GPT-style model for benchmarks: token embedding, L pre-norm blocks (causal
// attention + 4x MLP), final norm, output head tied to the embedding.
#include <functional>
#include <memory>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

namespace zeroshard::bench {

struct GptShape {
  int64_t vocab = 2048;
  int64_t dim = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t seq = 128;
};

using UnitRunner =
    std::function<at::Tensor(const torch::nn::Module&, const std::function<at::Tensor()>&)>;

class Gpt : public torch::nn::Module {
 public:
  explicit Gpt(const GptShape& shape);
  // Mean next-token loss over `tokens` (batch x seq+1); every module runs through `run_unit`.
  at::Tensor loss(const at::Tensor& tokens, const UnitRunner& run_unit);
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const { return blocks_; }

 private:
  GptShape shape_;
  torch::nn::Embedding embedding_{nullptr};
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  torch::nn::LayerNorm final_norm_{nullptr};
};

}  // namespace zeroshard::bench
