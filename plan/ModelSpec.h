#pragma once
// What the memory model needs to know about a model: its exact parameter count,
// how parameters split into stage-3 units (as engine/UnitPartition.h cuts a module tree:
// one per block of every stack, one per module left over, a head tied to the embedding
// in the embedding's), the sizes of its tensors, and the shape numbers that drive
// activation memory.
#include <algorithm>
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
  int64_t experts = 1;              // > 1: a mixture of experts with a router per block
  int64_t expert_intermediate = 0;  // each expert's MLP size (0: intermediate)
  int64_t experts_per_token = 1;    // the router's top k
  std::vector<bool> dense_layers;   // per layer (empty: none): a dense MLP, not experts
  bool qk_norm = false;             // a norm of head_dim on queries and keys (qwen3)
  bool tied_embeddings = false;     // lm_head shares the embedding matrix
  bool learned_positions = false;   // a position-embedding table (gpt2)
  bool fused_qkv = false;           // one q|k|v projection module
  bool qkv_bias = false;
  bool out_bias = false;
  bool gated_mlp = true;  // gate/up/down (llama) versus fc1/fc2 (gpt2)
  bool mlp_bias = false;
  bool norm_bias = false;
  int norms_per_block = 2;
  bool lm_head_bias = false;
  bool eager_attention = false;  // attention scores materialised (attn_implementation "eager")
  bool gelu_in_ops = false;      // "gelu_new": a tanh GELU written in torch operations
  bool cache_copies_kv = false;  // the layer's cache keeps copies of keys and values (gpt2)
  // Ranks that split the model as transformers' tp_plan for these families does: q, k, v,
  // gate and up by output, o and down by input (their biases whole), an untied head by
  // vocabulary; embeddings, norms and routers stay whole. A spec made from it counts one
  // rank's slices, and its heads and widths are one rank's (activations without sequence
  // parallelism: the residual stream whole).
  int64_t tensor_parallel = 1;
  // Pipeline stages the blocks are split into (plan/PipelineStages.h), and which of them
  // this spec holds (one; several on one rank under interleaved schedules): their blocks
  // only, the embedding with the first stage, the final norm and the head with the last
  // (a tied head holds the embedding matrix there too, as DeepSpeed's TiedLayerSpec keeps a
  // copy on each stage that uses it).
  int64_t pipeline_stages = 1;
  std::vector<int64_t> pipeline_held{0};
  // Ranks a mixture of experts' experts are split over (expert parallelism): each block's
  // experts/expert_parallel experts are a unit of their own, sharded over the ranks holding
  // the same experts (ModelSpec::unit_expert); 1: the experts in the block's unit.
  int64_t expert_parallel = 1;
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
  // What a block saves for backward (plan/MemoryModel.cpp activation_bytes; 0 = unknown,
  // taken as a GPT block: kv_heads = heads, head_dim = hidden / heads, intermediate = 4h).
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;       // each expert's, in a mixture of experts
  int64_t experts_per_token = 0;  // a mixture of experts' top k (0: a dense MLP)
  int mlp_tensors = 2;            // tensors of width `intermediate` an MLP keeps
  int mlp_matmuls = 2;            // matmuls onto `intermediate` (gate and up; or fc1 alone)
  int64_t experts = 0;            // a mixture of experts' router width (0: a dense MLP)
  bool cache_copies_kv = false;   // keys and values copied into the layer's cache
  int norms_per_block = 2;
  bool norm_fp32_input = false;  // an RMSNorm that computes in fp32 keeps an fp32 copy of its input
  bool attention_scores = true;  // eager attention keeps a·s² scores; sdpa/flash do not
  bool has_head = true;          // the logits (and the loss's log-probabilities) are made here
  std::vector<int64_t> unit_params;  // stage-3 units (docs/architecture.md "Stage-3 units")
  // Per unit of unit_params (empty: none): whether stage 3 keeps it whole on every rank
  // (parameters outside every declared unit); their optimizer state and gradients are
  // still sharded, and parameter offload leaves them on the device.
  std::vector<bool> unit_whole;
  bool is_whole(size_t unit) const { return unit < unit_whole.size() && unit_whole[unit]; }
  // Per unit of unit_params (empty: none): frozen (requires_grad false), so it has no
  // gradients and no optimizer state.
  std::vector<bool> unit_frozen;
  bool is_frozen(size_t unit) const { return unit < unit_frozen.size() && unit_frozen[unit]; }
  // Per unit (empty: unknown, every element counted as one): the elements of nn.Linear and
  // nn.Embedding weights, what weight_quantization codes (engine/QuantizedWeights.h).
  std::vector<int64_t> unit_quantizable;
  int64_t quantizable(size_t unit) const {
    return unit < unit_quantizable.size() ? unit_quantizable[unit] : unit_params.at(unit);
  }
  // Expert parallelism: per unit (empty: none), whether it holds experts split over
  // expert_parallel ranks, so that each is sharded over ranks / expert_parallel (the ranks
  // holding the same experts) instead of every one (engine/ParallelDims.h edp).
  std::vector<bool> unit_expert;
  int64_t expert_parallel = 1;
  // The ranks unit `unit` is sharded over when the model's others are over `ranks`.
  int64_t sharding_ranks(size_t unit, int64_t ranks) const {
    const bool expert = unit < unit_expert.size() && unit_expert[unit];
    return expert ? std::max<int64_t>(1, ranks / expert_parallel) : ranks;
  }
  int64_t largest_module_params = 0;                       // DeepSpeed's largest_layer_params
  std::vector<std::pair<int64_t, int64_t>> tensor_counts;  // (numel, how many)
  // Bytes of the model's buffers (every rank holds them whole); a live model's only:
  // config.json families leave it 0.
  int64_t buffer_bytes = 0;

  int64_t largest_unit() const;
  // Parameters with gradients and optimizer state (every one where no unit is frozen).
  int64_t trainable_params() const;
  // Every unit frozen: a model served, not trained (zeroshard.init_inference).
  bool all_frozen() const;
  int64_t largest_padded_unit(int64_t ranks) const;  // in full, as stage 3 gathers it
  // Parameters in tensors of at most `threshold` elements: stage 3 keeps those whole.
  int64_t persistent_params(int64_t threshold) const;
  // Whether activations can be estimated (layers, hidden and heads known).
  bool has_shape() const { return layers > 0 && hidden > 0 && heads > 0; }
};

// One module's parameter tensors (what DeepSpeed's estimator calls a layer), and the
// modules of one stage-3 unit.
using ModuleTensors = std::vector<int64_t>;
using UnitModules = std::vector<ModuleTensors>;
ModuleTensors linear_tensors(int64_t in, int64_t out, bool bias);
ModuleTensors norm_tensors(int64_t size, bool bias);

// A model's units, in any order; build() makes a spec's counts from them (its shape
// numbers are the caller's to fill).
class SpecBuilder {
 public:
  // `expert`: the unit holds experts split over expert-parallel ranks.
  void add(const UnitModules& unit, int64_t count = 1, bool expert = false);
  ModelSpec build(const std::string& model_type, const std::string& source) const;

 private:
  struct Added {
    UnitModules modules;
    int64_t count;
    bool expert;
  };
  std::vector<Added> units_;
};

// A decoder-only transformer's units: the embedding (with the head where tied), a
// learned position table, the blocks, the final norm, the head where untied.
void add_decoder_units(const TransformerArch& arch, SpecBuilder& builder);
// transformers' attn_implementation names: whether that attention keeps its a·s² scores
// for backward (eager) or not (sdpa, flash_attention_2/3, flex_attention); an error
// naming `what` for any other name.
bool attention_keeps_scores(const std::string& attn_implementation, const std::string& what);

// The shape numbers activation memory reads (layers, widths, block shape, whether it makes
// the logits), from `shaped`
// (a config.json's spec) into `spec` (a live model's units and counts).
void take_shape(ModelSpec& spec, const ModelSpec& shaped);

// The block-shape numbers of `arch` that activation memory reads, into `spec`.
void set_block_shape(ModelSpec& spec, const TransformerArch& arch);
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
  int64_t tensor_parallel = 1;  // TransformerArch's; needs layers, hidden and heads
  int64_t pipeline_stages = 1;  // TransformerArch's; needs the shape and no params total
  std::vector<int64_t> pipeline_held{0};
};
ModelSpec spec_from_numbers(const ExplicitModel& m);

}  // namespace zeroshard
