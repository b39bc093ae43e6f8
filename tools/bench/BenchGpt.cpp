#include "tools/bench/BenchGpt.h"

#include <cmath>

#include <torch/torch.h>

namespace zeroshard::bench {
namespace {

class Block : public torch::nn::Module {
 public:
  explicit Block(const GptShape& s) : s_(s) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.dim})));
    qkv = register_module("qkv", torch::nn::Linear(s.dim, 3 * s.dim));
    proj = register_module("proj", torch::nn::Linear(s.dim, s.dim));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.dim})));
    fc1 = register_module("fc1", torch::nn::Linear(s.dim, 4 * s.dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * s.dim, s.dim));
  }

  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), hd = s_.dim / s_.heads;
    auto parts = qkv->forward(ln1->forward(x)).chunk(3, -1);
    auto heads = [&](const at::Tensor& p) { return p.view({b, t, s_.heads, hd}).transpose(1, 2); };
    at::Tensor scores = heads(parts[0]).matmul(heads(parts[1]).transpose(-2, -1)) / std::sqrt(hd);
    scores = scores.masked_fill(torch::ones({t, t}, torch::kBool).triu(1), -1e4).softmax(-1);
    const at::Tensor attended =
        scores.matmul(heads(parts[2])).transpose(1, 2).reshape({b, t, s_.dim});
    const at::Tensor h = x + proj->forward(attended);
    return h + fc2->forward(torch::gelu(fc1->forward(ln2->forward(h))));
  }

 private:
  GptShape s_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};

}  // namespace

Gpt::Gpt(const GptShape& shape) : shape_(shape) {
  embedding_ = register_module("emb", torch::nn::Embedding(shape.vocab, shape.dim));
  {
    torch::NoGradGuard no_grad;  // GPT-2's scale: the tied head starts near uniform
    embedding_->weight.normal_(0, 0.02);
  }
  for (int64_t i = 0; i < shape.layers; ++i) {
    blocks_.push_back(register_module("block" + std::to_string(i), std::make_shared<Block>(shape)));
  }
  final_norm_ =
      register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.dim})));
}

at::Tensor Gpt::loss(const at::Tensor& tokens, const UnitRunner& run_unit) {
  const at::Tensor input = tokens.slice(1, 0, shape_.seq);
  const at::Tensor target = tokens.slice(1, 1, shape_.seq + 1);
  // Every module with parameters runs through run_unit: at stage 3 the embedding and the
  // final norm are units too (engine/UnitPartition.h), and the tied head reads the
  // embedding's weight outside the embedding's forward.
  at::Tensor h = run_unit(*embedding_, [&] { return embedding_->forward(input); });
  for (const auto& block : blocks_) {
    auto* b = static_cast<Block*>(block.get());
    h = run_unit(*block, [&] { return b->forward(h); });
  }
  h = run_unit(*final_norm_, [&] { return final_norm_->forward(h); });
  const at::Tensor logits = run_unit(*embedding_, [&] { return h.matmul(embedding_->weight.t()); });
  return torch::cross_entropy_loss(logits.reshape({-1, shape_.vocab}), target.reshape({-1}));
}

}  // namespace zeroshard::bench
