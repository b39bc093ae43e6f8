#include "plan/ModelSpec.h"

#include <algorithm>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/Alignment.h"
#include "common/Error.h"
#include "plan/PipelineStages.h"

namespace zeroshard {
namespace {

void check_arch(const TransformerArch& a, const std::string& source) {
  if (a.hidden <= 0 || a.layers <= 0 || a.heads <= 0 || a.vocab <= 0 || a.intermediate <= 0 ||
      a.head_dim <= 0 || a.kv_heads <= 0) {
    fail(
        "{}: hidden, layers, heads, kv heads, head dim, vocab and intermediate size must all "
        "be positive",
        source);
  }
  // Each layer is a unit the spec lists: a count past any real model is an error, not an
  // allocation of that many entries.
  constexpr int64_t kMostLayers = 100'000;
  if (a.layers > kMostLayers || a.experts > kMostLayers) {
    fail("{}: {} layers and {} experts; allowed: at most {} of each", source, a.layers, a.experts,
         kMostLayers);
  }
  const int64_t tp = a.tensor_parallel;
  if (tp < 1) fail("{}: tensor-parallel size {} is not allowed; allowed: 1 or more", source, tp);
  if (a.pipeline_stages < 1 || a.pipeline_stages > a.layers) {
    fail("{}: {} pipeline stages for {} layers; allowed: 1 to {} (each stage holds a block)",
         source, a.pipeline_stages, a.layers, a.layers);
  }
  for (int64_t stage : a.pipeline_held) {
    if (stage < 0 || stage >= a.pipeline_stages)
      fail("{}: pipeline stage {} of {}; allowed: 0 to {}", source, stage, a.pipeline_stages,
           a.pipeline_stages - 1);
  }
  const int64_t ep = a.expert_parallel;
  if (ep > 1 && (a.experts <= 1 || a.experts % ep != 0)) {
    fail(
        "{}: expert-parallel size {} for {} experts; allowed: a divisor of the experts of a "
        "mixture of experts (num_local_experts / num_experts), or 1",
        source, ep, a.experts);
  }
  const std::pair<const char*, int64_t> split[] = {
      {"num_attention_heads", a.heads},
      {"num_key_value_heads", a.kv_heads},
      {"intermediate_size", a.intermediate},
      {"the expert intermediate size", a.expert_intermediate},
      {"vocab_size (the untied head is split by vocabulary)", a.tied_embeddings ? 0 : a.vocab}};
  for (const auto& [what, value] : split) {
    if (value % tp != 0) {
      fail("{}: tensor-parallel size {} does not divide {} ({}); allowed: a divisor of it", source,
           tp, what, value);
    }
  }
}

// A block's modules: `dense` holds them all, or, with experts split over ranks
// (expert_parallel > 1), all but this rank's experts, which are `experts`.
struct BlockParts {
  UnitModules dense, experts;
};

BlockParts block_parts(const TransformerArch& a, int64_t layer) {
  const int64_t tp = a.tensor_parallel;  // each rank's share of heads and widths
  const int64_t q = a.heads * a.head_dim / tp;
  const int64_t kv = a.kv_heads * a.head_dim / tp;
  UnitModules mods;
  for (int i = 0; i < a.norms_per_block; ++i) mods.push_back(norm_tensors(a.hidden, a.norm_bias));
  if (a.fused_qkv) {
    mods.push_back(linear_tensors(a.hidden, q + 2 * kv, a.qkv_bias));
  } else {
    mods.push_back(linear_tensors(a.hidden, q, a.qkv_bias));
    mods.push_back(linear_tensors(a.hidden, kv, a.qkv_bias));
    mods.push_back(linear_tensors(a.hidden, kv, a.qkv_bias));
  }
  if (a.qk_norm) mods.insert(mods.end(), 2, norm_tensors(a.head_dim, false));
  mods.push_back(linear_tensors(q, a.hidden, a.out_bias));
  const bool dense = a.experts <= 1 || (static_cast<size_t>(layer) < a.dense_layers.size() &&
                                        a.dense_layers[static_cast<size_t>(layer)]);
  const int64_t experts = dense ? 1 : a.experts;
  const int64_t inner =
      (dense || a.expert_intermediate == 0 ? a.intermediate : a.expert_intermediate) / tp;
  if (!dense) mods.push_back(linear_tensors(a.hidden, a.experts, false));  // router
  const bool apart = !dense && a.expert_parallel > 1;
  UnitModules split;
  UnitModules& mlps = apart ? split : mods;
  for (int64_t e = 0; e < (apart ? experts / a.expert_parallel : experts); ++e) {
    if (a.gated_mlp) {
      mlps.push_back(linear_tensors(a.hidden, inner, a.mlp_bias));  // gate
      mlps.push_back(linear_tensors(a.hidden, inner, a.mlp_bias));  // up
    } else {
      mlps.push_back(linear_tensors(a.hidden, inner, a.mlp_bias));
    }
    mlps.push_back(linear_tensors(inner, a.hidden, a.mlp_bias));  // down
  }
  return {mods, split};
}

int64_t module_sum(const ModuleTensors& m) {
  return std::accumulate(m.begin(), m.end(), int64_t{0});
}

}  // namespace

ModuleTensors linear_tensors(int64_t in, int64_t out, bool bias) {
  return bias ? ModuleTensors{in * out, out} : ModuleTensors{in * out};
}

ModuleTensors norm_tensors(int64_t size, bool bias) {
  return bias ? ModuleTensors{size, size} : ModuleTensors{size};
}

void SpecBuilder::add(const UnitModules& unit, int64_t count, bool expert) {
  if (count > 0) units_.push_back({unit, count, expert});
}

ModelSpec SpecBuilder::build(const std::string& model_type, const std::string& source) const {
  ModelSpec spec;
  spec.source = source;
  spec.model_type = model_type;
  std::map<int64_t, int64_t> counts;
  for (const auto& [modules, count, expert] : units_) {
    int64_t unit = 0;
    for (const auto& m : modules) {
      unit += module_sum(m);
      spec.largest_module_params = std::max(spec.largest_module_params, module_sum(m));
      for (int64_t numel : m) counts[numel] += count;
    }
    spec.unit_params.insert(spec.unit_params.end(), count, unit);
    spec.unit_expert.insert(spec.unit_expert.end(), count, expert);
    spec.total_params += unit * count;
  }
  spec.tensor_counts.assign(counts.begin(), counts.end());
  return spec;
}

int64_t ModelSpec::largest_unit() const {
  return unit_params.empty() ? total_params
                             : *std::max_element(unit_params.begin(), unit_params.end());
}

int64_t ModelSpec::trainable_params() const {
  if (unit_params.empty()) return total_params;
  int64_t total = 0;
  for (size_t u = 0; u < unit_params.size(); ++u)
    if (!is_frozen(u)) total += unit_params[u];
  return total;
}

bool ModelSpec::all_frozen() const {
  return !unit_params.empty() && trainable_params() == 0;
}

int64_t ModelSpec::largest_padded_unit(int64_t ranks) const {
  return padded_shard_numel(largest_unit(), ranks) * ranks;
}

int64_t ModelSpec::persistent_params(int64_t threshold) const {
  int64_t total = 0;
  for (const auto& [numel, count] : tensor_counts)
    if (numel <= threshold) total += numel * count;
  return total;
}

namespace {

// One pipeline stage's modules, in their order.
void add_stage_units(const TransformerArch& a, int64_t stage, SpecBuilder& b) {
  const auto [first_block, blocks] = stage_blocks(a.layers, a.pipeline_stages, stage);
  const bool first = stage == 0, last = stage == a.pipeline_stages - 1;
  // The head tied to the embedding is one unit with it (its bias too, where it has one).
  UnitModules embedding{{a.vocab * a.hidden}};
  if (a.tied_embeddings && a.lm_head_bias && last) embedding.push_back({a.vocab});
  if (first || (last && a.tied_embeddings)) b.add(embedding);
  if (a.learned_positions && first) b.add({{a.max_positions * a.hidden}});
  const auto add_blocks = [&b](const BlockParts& parts, int64_t count) {
    b.add(parts.dense, count);
    if (!parts.experts.empty()) b.add(parts.experts, count, /*expert=*/true);
  };
  bool uniform = a.experts <= 1 || a.dense_layers.empty();
  if (uniform) {
    if (blocks > 0) add_blocks(block_parts(a, 0), blocks);
  } else {
    for (int64_t layer = first_block; layer < first_block + blocks; ++layer)
      add_blocks(block_parts(a, layer), 1);
  }
  if (!last) return;
  b.add({norm_tensors(a.hidden, a.norm_bias)});
  if (!a.tied_embeddings)
    b.add({linear_tensors(a.hidden, a.vocab / a.tensor_parallel, a.lm_head_bias)});
}

}  // namespace

void add_decoder_units(const TransformerArch& a, SpecBuilder& b) {
  for (int64_t stage : a.pipeline_held) add_stage_units(a, stage, b);
}

bool attention_keeps_scores(const std::string& name, const std::string& what) {
  static const std::vector<std::string> fused{"sdpa", "flash_attention_2", "flash_attention_3",
                                              "flex_attention"};
  if (name == "eager") return true;
  if (std::find(fused.begin(), fused.end(), name) != fused.end()) return false;
  fail("{}: '{}' is not allowed; allowed: eager, {}", what, name,
       fmt::format("{}", fmt::join(fused, ", ")));
}

void take_shape(ModelSpec& spec, const ModelSpec& shaped) {
  spec.layers = shaped.layers;
  spec.has_head = shaped.has_head;
  spec.hidden = shaped.hidden;
  spec.heads = shaped.heads;
  spec.vocab = shaped.vocab;
  spec.max_positions = shaped.max_positions;
  spec.kv_heads = shaped.kv_heads;
  spec.head_dim = shaped.head_dim;
  spec.intermediate = shaped.intermediate;
  spec.experts_per_token = shaped.experts_per_token;
  spec.mlp_tensors = shaped.mlp_tensors;
  spec.mlp_matmuls = shaped.mlp_matmuls;
  spec.experts = shaped.experts;
  spec.cache_copies_kv = shaped.cache_copies_kv;
  spec.norms_per_block = shaped.norms_per_block;
  spec.norm_fp32_input = shaped.norm_fp32_input;
  spec.attention_scores = shaped.attention_scores;
}

void set_block_shape(ModelSpec& spec, const TransformerArch& a) {
  spec.kv_heads = a.kv_heads;
  spec.head_dim = a.head_dim;
  const bool moe = a.experts > 1;
  spec.intermediate = moe && a.expert_intermediate > 0 ? a.expert_intermediate : a.intermediate;
  spec.experts_per_token = moe ? a.experts_per_token : 0;
  // gate, activation, up, product; or first linear's output, activation (gelu_new keeps
  // its cube's sum, tanh and 1 + tanh as well)
  spec.mlp_tensors = (a.gated_mlp ? 4 : 2) + (a.gelu_in_ops ? 3 : 0);
  spec.mlp_matmuls = a.gated_mlp ? 2 : 1;
  spec.experts = moe ? a.experts : 0;
  spec.cache_copies_kv = a.cache_copies_kv;
  spec.norms_per_block = a.norms_per_block;
  // Families without norm biases use RMSNorm, which transformers computes in fp32.
  spec.norm_fp32_input = !a.norm_bias;
  spec.attention_scores = a.eager_attention;
}

ModelSpec spec_from_arch(const TransformerArch& a, const std::string& model_type,
                         const std::string& source) {
  check_arch(a, source);
  SpecBuilder b;
  add_decoder_units(a, b);
  ModelSpec spec = b.build(model_type, source);
  spec.expert_parallel = a.expert_parallel;
  spec.layers = 0;
  spec.has_head = false;
  for (int64_t stage : a.pipeline_held) {
    spec.layers += stage_blocks(a.layers, a.pipeline_stages, stage).second;
    spec.has_head = spec.has_head || stage == a.pipeline_stages - 1;
  }
  spec.hidden = a.hidden;
  spec.heads = a.heads;
  spec.vocab = a.vocab;
  spec.max_positions = a.max_positions;
  set_block_shape(spec, a);
  spec.heads /= a.tensor_parallel;  // one rank's: activations as it holds them
  spec.kv_heads /= a.tensor_parallel;
  spec.intermediate /= a.tensor_parallel;
  return spec;
}

ModelSpec spec_from_numbers(const ExplicitModel& m) {
  for (int64_t v : {m.params, m.layers, m.hidden, m.heads, m.kv_heads, m.vocab, m.intermediate})
    if (v < 0) fail("model sizes must be positive; got {}", v);
  ModelSpec spec;
  if (m.layers > 0 && m.hidden > 0 && m.heads > 0) {
    TransformerArch a;
    a.layers = m.layers;
    a.hidden = m.hidden;
    a.heads = m.heads;
    a.kv_heads = m.kv_heads > 0 ? m.kv_heads : m.heads;
    a.head_dim = m.hidden / m.heads;
    a.vocab = m.vocab > 0 ? m.vocab : m.tensor_parallel;  // unknown: a head of one column per rank
    // A llama-style MLP when the intermediate size is not given: 8h/3 rounded to 256.
    a.intermediate = m.intermediate > 0 ? m.intermediate : round_up(8 * m.hidden / 3, 256);
    if (m.pipeline_stages > 1 && m.params > 0) {  // the estimator refuses it by name first
      fail("internal: a parameter total cannot be split over {} pipeline stages",
           m.pipeline_stages);
    }
    a.pipeline_stages = m.pipeline_stages;
    a.pipeline_held = m.pipeline_held;
    spec = spec_from_arch(a, "explicit", "explicit numbers");
    if (m.params > 0) {
      const int64_t blocks = m.layers * spec.unit_params[1];  // after the embedding
      if (m.params < blocks) {
        fail(
            "--params {} is less than {} layers of hidden size {} alone ({} parameters); "
            "allowed: a total at least that large",
            m.params, m.layers, m.hidden, blocks);
      }
      a.tensor_parallel = m.tensor_parallel;
      ModelSpec split = m.tensor_parallel == 1 ? std::move(spec)
                                               : spec_from_arch(a, "explicit", "explicit numbers");
      // Outside the blocks (embeddings, norms, head) only the total is known: one unit,
      // held whole by every tensor-parallel rank.
      const int64_t block = split.unit_params[1];
      split.unit_params.assign(m.layers, block);
      split.unit_params.push_back(m.params - blocks);
      split.total_params = m.layers * block + m.params - blocks;
      spec = std::move(split);
    } else if (m.tensor_parallel != 1) {
      a.tensor_parallel = m.tensor_parallel;
      spec = spec_from_arch(a, "explicit", "explicit numbers");
    }
    spec.vocab = m.vocab;
    return spec;
  }
  if (m.params <= 0) {
    fail(
        "give the model as --hf-config FILE or --params N (optionally with --layers, "
        "--hidden, --heads, --vocab)");
  }
  if (m.tensor_parallel > 1) {
    fail(
        "--tp {} needs the model's shape to know what it splits: give --hf-config FILE, or "
        "--layers, --hidden and --heads with --params",
        m.tensor_parallel);
  }
  spec.source = "explicit numbers";
  spec.model_type = "explicit";
  spec.total_params = m.params;
  spec.layers = m.layers;
  spec.hidden = m.hidden;
  spec.vocab = m.vocab;
  const int64_t units = m.layers > 0 ? m.layers : 1;
  spec.unit_params.assign(units, ceil_div(m.params, units));
  spec.largest_module_params = spec.unit_params.front();  // unknown: assume one module per unit
  spec.tensor_counts = {{spec.unit_params.front(), units}};
  return spec;
}

}  // namespace zeroshard
