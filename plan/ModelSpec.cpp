#include "plan/ModelSpec.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "common/Alignment.h"
#include "common/Error.h"

namespace zeroshard {
namespace {

// One module's parameter tensors; a module is what DeepSpeed's estimator calls a layer.
using Module = std::vector<int64_t>;

Module linear(int64_t in, int64_t out, bool bias) {
  return bias ? Module{in * out, out} : Module{in * out};
}

Module norm(int64_t h, bool bias) {
  return bias ? Module{h, h} : Module{h};
}

std::vector<Module> block_modules(const TransformerArch& a) {
  const int64_t q = a.heads * a.head_dim;
  const int64_t kv = a.kv_heads * a.head_dim;
  std::vector<Module> mods;
  for (int i = 0; i < a.norms_per_block; ++i) mods.push_back(norm(a.hidden, a.norm_bias));
  if (a.fused_qkv) {
    mods.push_back(linear(a.hidden, q + 2 * kv, a.qkv_bias));
  } else {
    mods.push_back(linear(a.hidden, q, a.qkv_bias));
    mods.push_back(linear(a.hidden, kv, a.qkv_bias));
    mods.push_back(linear(a.hidden, kv, a.qkv_bias));
  }
  mods.push_back(linear(q, a.hidden, a.out_bias));
  if (a.experts > 1) mods.push_back(linear(a.hidden, a.experts, false));  // router
  for (int64_t e = 0; e < a.experts; ++e) {
    if (a.gated_mlp) {
      mods.push_back(linear(a.hidden, a.intermediate, a.mlp_bias));  // gate
      mods.push_back(linear(a.hidden, a.intermediate, a.mlp_bias));  // up
    } else {
      mods.push_back(linear(a.hidden, a.intermediate, a.mlp_bias));
    }
    mods.push_back(linear(a.intermediate, a.hidden, a.mlp_bias));  // down
  }
  return mods;
}

std::vector<Module> root_modules(const TransformerArch& a) {
  std::vector<Module> mods{{a.vocab * a.hidden}};
  if (a.learned_positions) mods.push_back({a.max_positions * a.hidden});
  mods.push_back(norm(a.hidden, a.norm_bias));
  if (!a.tied_embeddings) mods.push_back(linear(a.hidden, a.vocab, a.lm_head_bias));
  return mods;
}

int64_t module_sum(const Module& m) {
  return std::accumulate(m.begin(), m.end(), int64_t{0});
}

int64_t modules_sum(const std::vector<Module>& mods) {
  int64_t total = 0;
  for (const auto& m : mods) total += module_sum(m);
  return total;
}

void add_tensors(std::map<int64_t, int64_t>& counts, const std::vector<Module>& mods,
                 int64_t repeat) {
  for (const auto& m : mods)
    for (int64_t numel : m) counts[numel] += repeat;
}

}  // namespace

int64_t ModelSpec::largest_unit() const {
  return unit_params.empty() ? total_params
                             : *std::max_element(unit_params.begin(), unit_params.end());
}

int64_t ModelSpec::persistent_params(int64_t threshold) const {
  int64_t total = 0;
  for (const auto& [numel, count] : tensor_counts)
    if (numel <= threshold) total += numel * count;
  return total;
}

ModelSpec spec_from_arch(const TransformerArch& a, const std::string& model_type,
                         const std::string& source) {
  if (a.hidden <= 0 || a.layers <= 0 || a.heads <= 0 || a.vocab <= 0 || a.intermediate <= 0 ||
      a.head_dim <= 0 || a.kv_heads <= 0) {
    fail(
        "{}: hidden, layers, heads, kv heads, head dim, vocab and intermediate size must all "
        "be positive",
        source);
  }
  const auto block = block_modules(a);
  const auto root = root_modules(a);
  ModelSpec spec;
  spec.source = source;
  spec.model_type = model_type;
  spec.layers = a.layers;
  spec.hidden = a.hidden;
  spec.heads = a.heads;
  spec.vocab = a.vocab;
  spec.max_positions = a.max_positions;
  spec.unit_params.assign(a.layers, modules_sum(block));
  spec.unit_params.push_back(modules_sum(root));
  spec.total_params = a.layers * modules_sum(block) + modules_sum(root);
  for (const auto* mods : {&block, &root})
    for (const auto& m : *mods)
      spec.largest_module_params = std::max(spec.largest_module_params, module_sum(m));
  std::map<int64_t, int64_t> counts;
  add_tensors(counts, block, a.layers);
  add_tensors(counts, root, 1);
  spec.tensor_counts.assign(counts.begin(), counts.end());
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
    a.vocab = m.vocab > 0 ? m.vocab : 1;
    // A llama-style MLP when the intermediate size is not given: 8h/3 rounded to 256.
    a.intermediate = m.intermediate > 0 ? m.intermediate : round_up(8 * m.hidden / 3, 256);
    spec = spec_from_arch(a, "explicit", "explicit numbers");
    const int64_t blocks = spec.total_params - spec.unit_params.back();
    if (m.params > 0) {
      if (m.params < blocks) {
        fail(
            "--params {} is less than {} layers of hidden size {} alone ({} parameters); "
            "allowed: a total at least that large",
            m.params, m.layers, m.hidden, blocks);
      }
      spec.unit_params.back() = m.params - blocks;
      spec.total_params = m.params;
    }
    spec.vocab = m.vocab;
    return spec;
  }
  if (m.params <= 0) {
    fail(
        "give the model as --hf-config FILE or --params N (optionally with --layers, "
        "--hidden, --heads, --vocab)");
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
