#include "plan/HfConfig.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/Error.h"
#include "common/Files.h"

namespace zeroshard {
namespace {

using Json = nlohmann::json;

// Reads config.json keys with errors that name the file and the key.
class Reader {
 public:
  Reader(const Json& json, std::string origin) : json_(json), origin_(std::move(origin)) {}

  int64_t required(const char* key) const {
    if (!json_.contains(key) || json_[key].is_null()) {
      fail("{}: key '{}' is missing; it is required for model_type '{}'", origin_, key, type());
    }
    return positive(key);
  }

  int64_t optional(const char* key, int64_t fallback) const {
    if (!json_.contains(key) || json_[key].is_null()) return fallback;
    return positive(key);
  }

  bool flag(const char* key, bool fallback) const {
    if (!json_.contains(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_boolean()) {
      fail("{}: key '{}' is {}; allowed: true or false", origin_, key, json_[key].dump());
    }
    return json_[key].get<bool>();
  }

  std::string type() const { return json_.value("model_type", std::string("?")); }

 private:
  int64_t positive(const char* key) const {
    const Json& v = json_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      fail("{}: key '{}' is {}; allowed: a positive integer", origin_, key, v.dump());
    }
    return v.get<int64_t>();
  }

  const Json& json_;
  std::string origin_;
};

// Llama and the families built like it: separate q/k/v/o, gated MLP, RMSNorm.
TransformerArch llama_like(const Reader& r) {
  TransformerArch a;
  a.vocab = r.required("vocab_size");
  a.hidden = r.required("hidden_size");
  a.layers = r.required("num_hidden_layers");
  a.heads = r.required("num_attention_heads");
  a.kv_heads = r.optional("num_key_value_heads", a.heads);
  a.head_dim = r.optional("head_dim", a.hidden / a.heads);
  a.intermediate = r.required("intermediate_size");
  a.max_positions = r.optional("max_position_embeddings", 0);
  a.tied_embeddings = r.flag("tie_word_embeddings", false);
  a.qkv_bias = a.out_bias = r.flag("attention_bias", false);
  a.mlp_bias = r.flag("mlp_bias", false);
  return a;
}

TransformerArch mixtral(const Reader& r) {
  TransformerArch a = llama_like(r);
  a.experts = r.required("num_local_experts");
  return a;
}

TransformerArch qwen2(const Reader& r) {
  TransformerArch a = llama_like(r);
  a.qkv_bias = true;  // Qwen2 has q/k/v biases and none on o_proj
  a.out_bias = false;
  return a;
}

TransformerArch gemma(const Reader& r) {
  TransformerArch a = llama_like(r);
  a.tied_embeddings = r.flag("tie_word_embeddings", true);
  return a;
}

// Plain multi-head attention (as many key/value heads as heads), the sizes under the
// family's own names.
TransformerArch multi_head(const Reader& r, const char* hidden, const char* layers,
                           const char* heads) {
  TransformerArch a;
  a.vocab = r.required("vocab_size");
  a.hidden = r.required(hidden);
  a.layers = r.required(layers);
  a.heads = a.kv_heads = r.required(heads);
  a.head_dim = a.hidden / a.heads;
  return a;
}

TransformerArch gpt2(const Reader& r) {
  TransformerArch a = multi_head(r, "n_embd", "n_layer", "n_head");
  a.intermediate = r.optional("n_inner", 4 * a.hidden);
  a.max_positions = r.required("n_positions");
  a.tied_embeddings = r.flag("tie_word_embeddings", true);
  a.learned_positions = a.fused_qkv = true;
  a.qkv_bias = a.out_bias = a.mlp_bias = a.norm_bias = true;
  a.gated_mlp = false;
  return a;
}

TransformerArch gpt_neox(const Reader& r) {
  TransformerArch a = multi_head(r, "hidden_size", "num_hidden_layers", "num_attention_heads");
  a.intermediate = r.required("intermediate_size");
  a.max_positions = r.optional("max_position_embeddings", 0);
  a.tied_embeddings = r.flag("tie_word_embeddings", false);
  a.fused_qkv = true;
  a.qkv_bias = a.out_bias = r.flag("attention_bias", true);
  a.mlp_bias = a.norm_bias = true;
  a.gated_mlp = false;
  return a;
}

// Phi (phi-1/1.5/2): parallel attention and MLP after one LayerNorm, biases everywhere.
TransformerArch phi(const Reader& r) {
  TransformerArch a = llama_like(r);
  a.head_dim = a.hidden / a.heads;  // phi has no head_dim key of its own
  a.qkv_bias = a.out_bias = a.mlp_bias = a.norm_bias = a.lm_head_bias = true;
  a.gated_mlp = false;
  a.norms_per_block = 1;
  return a;
}

const std::map<std::string, std::function<TransformerArch(const Reader&)>>& families() {
  static const auto* table =
      new std::map<std::string, std::function<TransformerArch(const Reader&)>>{
          {"llama", llama_like}, {"mistral", llama_like}, {"mixtral", mixtral},   {"qwen2", qwen2},
          {"gemma", gemma},      {"gpt2", gpt2},          {"gpt_neox", gpt_neox}, {"phi", phi},
      };
  return *table;
}

}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> names;
  for (const auto& entry : families()) names.push_back(entry.first);
  return names;
}

ModelSpec spec_from_hf_json(const std::string& json_text, const std::string& origin) {
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::exception& e) {
    fail("{}: not valid JSON: {}", origin, e.what());
  }
  if (!json.is_object()) fail("{}: a Hugging Face config.json must be a JSON object", origin);
  if (!json.contains("model_type") || !json["model_type"].is_string()) {
    fail("{}: key 'model_type' is missing; allowed: one of {}", origin,
         fmt::format("{}", fmt::join(supported_model_types(), ", ")));
  }
  const std::string type = json["model_type"].get<std::string>();
  const auto family = families().find(type);
  if (family == families().end()) {
    fail("{}: model_type '{}' is not supported; allowed: {} (or give --params and the shape)",
         origin, type, fmt::format("{}", fmt::join(supported_model_types(), ", ")));
  }
  const Reader reader(json, origin);
  return spec_from_arch(family->second(reader), type, origin);
}

ModelSpec spec_from_hf_file(const std::string& path) {
  return spec_from_hf_json(read_whole_file(path, "--hf-config"), path);
}

}  // namespace zeroshard
