#pragma once
// The toy model the planner's tests size: two units of 3,200 parameters, each one tensor;
// and TinyLlama-1.1B's shape for the activation tests.
#include "plan/HfConfig.h"
#include "plan/MemoryModel.h"

namespace zeroshard::testing {

inline ModelSpec toy_spec() {
  ModelSpec s;
  s.total_params = 6400;
  s.unit_params = {3200, 3200};
  s.largest_module_params = 3200;
  s.tensor_counts = {{3200, 2}};
  return s;
}

// h 2048, 32 heads of 64, 4 key-value heads, I 5632, 22 layers, vocab 32000.
inline TransformerArch tiny_llama_arch() {
  TransformerArch a;
  a.vocab = 32000;
  a.hidden = 2048;
  a.layers = 22;
  a.heads = 32;
  a.kv_heads = 4;
  a.head_dim = 64;
  a.intermediate = 5632;
  return a;
}

}  // namespace zeroshard::testing
