#pragma once
// What the memory model needs to know about a model: its exact parameter count,
// how parameters split into stage-3 units (one per transformer block plus a root
// unit for embeddings and head), the sizes of its tensors, and the shape numbers
// that drive activation memory.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zeroshard {

// A decoder-only transformer as the Hugging Face families build it.
struct TransformerArch {
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t max_positions = 0;
  int64_t experts = 1;             // > 1: a mixture of experts with a router per block
  bool tied_embeddings = false;    // lm_head shares the embedding matrix
  bool learned_positions = false;  // a position-embedding table (gpt2)
  bool fused_qkv = false;          // one q|k|v projection module
  bool qkv_bias = false;
  bool out_bias = false;
  bool gated_mlp = true;  // gate/up/down (llama) versus fc1/fc2 (gpt2)
  bool mlp_bias = false;
  bool norm_bias = false;
  int norms_per_block = 2;
  bool lm_head_bias = false;
};

struct ModelSpec {
  std::string source;      // where the numbers came from, for reports
  std::string model_type;  // "llama", ... or "explicit"
  int64_t total_params = 0;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t vocab = 0;
  int64_t max_positions = 0;
  std::vector<int64_t> unit_params;  // stage-3 units: blocks, then the root unit
  // Per unit of unit_params (empty: none): whether stage 3 keeps it whole on every rank
  // (parameters outside every declared unit); their optimizer state and gradients are
  // still sharded, and parameter offload leaves them on the device.
  std::vector<bool> unit_whole;
  bool is_whole(size_t unit) const { return unit < unit_whole.size() && unit_whole[unit]; }
  int64_t largest_module_params = 0;                       // DeepSpeed's largest_layer_params
  std::vector<std::pair<int64_t, int64_t>> tensor_counts;  // (numel, how many)

  int64_t largest_unit() const;
  // Parameters in tensors of at most `threshold` elements: stage 3 keeps those whole.
  int64_t persistent_params(int64_t threshold) const;
  // Whether activations can be estimated (layers, hidden and heads known).
  bool has_shape() const { return layers > 0 && hidden > 0 && heads > 0; }
};

ModelSpec spec_from_arch(const TransformerArch& arch, const std::string& model_type,
                         const std::string& source);

// From bare numbers: params is the total; the others refine units and activations
// where given (0 = unknown).
struct ExplicitModel {
  int64_t params = 0;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t vocab = 0;
  int64_t intermediate = 0;
};
ModelSpec spec_from_numbers(const ExplicitModel& m);

}  // namespace zeroshard
