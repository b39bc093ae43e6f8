#include "engine/QuantizedWeights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/Error.h"

namespace zeroshard {

void check_quantized_weights(const std::vector<NamedParam>& params, const QuantizedLayout& layout) {
  const std::string key = "weight_quantization.quantized_initialization";
  bool any = false;
  for (const NamedParam& p : params) {
    if (!p.quantizable) continue;
    any = true;
    if (p.param.requires_grad()) {
      fail(
          "config key '{}.num_bits' is {} with a trainable weight to quantize ({}); allowed: "
          "frozen weights only (zeroshard.init_inference, or requires_grad False), as "
          "quantized weights have no gradients",
          key, layout.bits, p.name);
    }
    if (p.param.dim() < 2 || p.param.size(1) % layout.group_size != 0) {
      fail(
          "config key '{}.group_size' is {}, and {} (shape [{}]) has {} along group_dim 1, not "
          "a multiple of it; allowed: a group_size dividing dimension 1 of every nn.Linear and "
          "nn.Embedding weight",
          key, layout.group_size, p.name, fmt::join(p.param.sizes(), ", "),
          p.param.dim() < 2 ? 1 : p.param.size(1));
    }
  }
  if (!any) {
    fail(
        "config key '{}.num_bits' is {}, and the model has no nn.Linear or nn.Embedding "
        "weight, the only ones it quantizes (as DeepSpeed's); allowed: a model with such "
        "layers, or no weight_quantization section",
        key, layout.bits);
  }
}

int64_t quantized_numel(const std::vector<NamedParam>& params) {
  int64_t n = 0;
  for (const NamedParam& p : params)
    if (p.quantizable) n += p.param.numel();
  return n;
}

}  // namespace zeroshard
