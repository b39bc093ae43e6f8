#pragma once
// Which parameters weight_quantization quantizes (NamedParam::quantizable: nn.Linear and
// nn.Embedding weights, as DeepSpeed's quantized_initialization), checked before any is built.
#include <vector>

#include "common/QuantizedLayout.h"
#include "zeroshard/Types.h"

namespace zeroshard {

// Refuses by name a quantized weight that trains, or whose dimension 1 is not whole groups
// (DeepSpeed's rule), and a model with no weight to quantize (nothing would be).
void check_quantized_weights(const std::vector<NamedParam>& params, const QuantizedLayout& layout);

// The elements of `params` that weight_quantization codes.
int64_t quantized_numel(const std::vector<NamedParam>& params);

}  // namespace zeroshard
