#include "plan/HfConfig.h"

#include <algorithm>
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

  // A value saved under either of two names (transformers writes some under its own).
  int64_t required_either(const char* key, const char* other) const {
    if (json_.contains(other) && !json_[other].is_null() && !json_.contains(key)) {
      return positive(other);
    }
    if (!json_.contains(key) || json_[key].is_null()) {
      fail("{}: key '{}' (or '{}') is missing; it is required for model_type '{}'", origin_, key,
           other, type());
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
  const std::string& origin() const { return origin_; }

  std::string text(const char* key, const std::string& fallback) const {
    if (!json_.contains(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_string()) {
      fail("{}: key '{}' is {}; allowed: a string", origin_, key, json_[key].dump());
    }
    return json_[key].get<std::string>();
  }

  // Layer indices (qwen3_moe's mlp_only_layers), or how many a list holds where a single
  // integer means one (llava's vision_feature_layer).
  std::vector<int64_t> integers(const char* key) const {
    if (!json_.contains(key) || json_[key].is_null()) return {};
    const Json& v = json_[key];
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (!v.is_array() ||
        !std::all_of(v.begin(), v.end(), [](const Json& e) { return e.is_number_integer(); })) {
      fail("{}: key '{}' is {}; allowed: an integer or a list of integers", origin_, key, v.dump());
    }
    return v.get<std::vector<int64_t>>();
  }

  // A nested config (llava's vision_config and text_config): errors name it too.
  Reader sub(const char* key) const {
    if (!json_.contains(key) || !json_[key].is_object()) {
      fail("{}: key '{}' is missing; it is required for model_type '{}'", origin_, key, type());
    }
    return Reader(json_[key], fmt::format("{} ({})", origin_, key));
  }

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
  a.experts_per_token = r.optional("num_experts_per_tok", 2);
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

// Gemma 2: a norm before and after both attention and MLP.
TransformerArch gemma2(const Reader& r) {
  TransformerArch a = gemma(r);
  a.norms_per_block = 4;
  return a;
}

// Qwen3: a norm of head_dim on queries and keys.
TransformerArch qwen3(const Reader& r) {
  TransformerArch a = llama_like(r);
  a.qk_norm = true;
  return a;
}

// Qwen3-MoE: experts of moe_intermediate_size behind a router, except in mlp_only_layers
// and in the layers decoder_sparse_step skips, which have a dense MLP.
TransformerArch qwen3_moe(const Reader& r) {
  TransformerArch a = qwen3(r);
  a.experts = r.required_either("num_experts", "num_local_experts");
  a.expert_intermediate = r.required("moe_intermediate_size");
  a.experts_per_token = r.optional("num_experts_per_tok", 8);
  const int64_t step = r.optional("decoder_sparse_step", 1);
  const std::vector<int64_t> dense = r.integers("mlp_only_layers");
  a.dense_layers.assign(static_cast<size_t>(a.layers), false);
  for (int64_t layer = 0; layer < a.layers; ++layer) {
    a.dense_layers[static_cast<size_t>(layer)] =
        (layer + 1) % step != 0 || std::find(dense.begin(), dense.end(), layer) != dense.end();
  }
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
  a.cache_copies_kv = r.flag("use_cache", true);
  a.gelu_in_ops = r.text("activation_function", "gelu_new") == "gelu_new";
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
  a.gelu_in_ops = r.text("hidden_act", "gelu_new") == "gelu_new";
  return a;
}

using Decoder = std::function<TransformerArch(const Reader&)>;

const std::map<std::string, Decoder>& decoders() {
  static const auto* table = new std::map<std::string, Decoder>{
      {"llama", llama_like}, {"mistral", llama_like},  {"mixtral", mixtral}, {"qwen2", qwen2},
      {"qwen3", qwen3},      {"qwen3_moe", qwen3_moe}, {"gemma", gemma},     {"gemma2", gemma2},
      {"gpt2", gpt2},        {"gpt_neox", gpt_neox},   {"phi", phi},
  };
  return *table;
}

TransformerArch decoder_arch(const Reader& r) {
  const auto family = decoders().find(r.type());
  if (family == decoders().end()) {
    fail("{}: model_type '{}' is not a supported language model; allowed: {}", r.origin(), r.type(),
         fmt::format("{}", fmt::join(supported_model_types(), ", ")));
  }
  TransformerArch a = family->second(r);
  // transformers' default is sdpa (no a·s² scores kept); "eager" materialises them.
  const std::string attention = r.text("_attn_implementation", r.text("attn_implementation", ""));
  a.eager_attention = attention == "eager";
  return a;
}

void set_shape(ModelSpec& spec, int64_t layers, int64_t hidden, int64_t heads, int64_t vocab,
               int64_t positions) {
  spec.layers = layers;
  spec.hidden = hidden;
  spec.heads = heads;
  spec.vocab = vocab;
  spec.max_positions = positions;
}

// T5 (and mT5): an encoder and a decoder stack sharing one embedding (the head too, where
// tied); the first block of each stack holds the relative position bias.
ModelSpec t5(const Reader& r) {
  const int64_t vocab = r.required("vocab_size"), d = r.required("d_model");
  const int64_t inner = r.required("num_heads") * r.required("d_kv"), ff = r.required("d_ff");
  const int64_t enc = r.required("num_layers"), dec = r.optional("num_decoder_layers", enc);
  const int64_t bias = r.optional("relative_attention_num_buckets", 32) * r.required("num_heads");
  const bool gated = r.text("feed_forward_proj", "relu").rfind("gated-", 0) == 0;
  const UnitModules attention{{d * inner}, {d * inner}, {d * inner}, {inner * d}};
  UnitModules mlp(gated ? 2 : 1, ModuleTensors{d * ff});
  mlp.push_back({ff * d});
  auto block = [&](bool decoder, bool first) {
    UnitModules m{{d}};
    m.insert(m.end(), attention.begin(), attention.end());
    if (first) m.push_back({bias});
    if (decoder) {
      m.push_back({d});
      m.insert(m.end(), attention.begin(), attention.end());
    }
    m.push_back({d});
    m.insert(m.end(), mlp.begin(), mlp.end());
    return m;
  };
  SpecBuilder b;
  b.add({{vocab * d}});
  for (const auto& [decoder, layers] : {std::pair{false, enc}, std::pair{true, dec}}) {
    b.add(block(decoder, true));
    b.add(block(decoder, false), layers - 1);
    b.add({{d}});  // final norm
  }
  if (!r.flag("tie_word_embeddings", true)) b.add({{d * vocab}});
  ModelSpec spec = b.build(r.type(), r.origin());
  set_shape(spec, enc + dec, d, r.required("num_heads"), vocab, 0);
  return spec;
}

// A CLIP vision tower's units: the embeddings (class token, patch convolution, positions),
// the norm before the blocks, the blocks, the norm after them.
void add_clip_units(const Reader& v, SpecBuilder& b) {
  if (v.type() != "clip_vision_model") {
    fail("{}: model_type '{}' is not a supported vision tower; allowed: clip_vision_model",
         v.origin(), v.type());
  }
  const int64_t h = v.required("hidden_size"), i = v.required("intermediate_size");
  const int64_t side = v.required("image_size") / v.required("patch_size");
  const int64_t patch = v.required("patch_size");
  b.add({{h}, {v.optional("num_channels", 3) * patch * patch * h}, {(side * side + 1) * h}});
  b.add({norm_tensors(h, true)});
  UnitModules block{norm_tensors(h, true), norm_tensors(h, true), linear_tensors(h, i, true),
                    linear_tensors(i, h, true)};
  block.insert(block.end(), 4, linear_tensors(h, h, true));
  b.add(block, v.required("num_hidden_layers"));
  b.add({norm_tensors(h, true)});
}

// LLaVA: a vision tower, a projector of two linear layers, a language model.
ModelSpec llava(const Reader& r) {
  const Reader vision = r.sub("vision_config"), text = r.sub("text_config");
  SpecBuilder b;
  add_clip_units(vision, b);
  const TransformerArch a = decoder_arch(text);
  const auto layers = r.integers("vision_feature_layer");
  const int64_t features = vision.required("hidden_size") * std::max<int64_t>(1, layers.size());
  const bool bias = r.flag("multimodal_projector_bias", true);
  b.add({linear_tensors(features, a.hidden, bias), linear_tensors(a.hidden, a.hidden, bias)});
  add_decoder_units(a, b);
  ModelSpec spec = b.build(r.type(), r.origin());
  set_shape(spec, a.layers, a.hidden, a.heads, a.vocab, a.max_positions);
  set_block_shape(spec, a);
  return spec;
}

using Whole = std::function<ModelSpec(const Reader&)>;

const std::map<std::string, Whole>& multi_stack() {
  static const auto* table =
      new std::map<std::string, Whole>{{"t5", t5}, {"mt5", t5}, {"llava", llava}};
  return *table;
}

std::vector<std::string> decoder_types() {
  std::vector<std::string> names;
  for (const auto& entry : decoders()) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> names;
  for (const auto& entry : decoders()) names.push_back(entry.first);
  for (const auto& entry : multi_stack()) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  return names;
}

ModelSpec spec_from_hf_json(const std::string& json_text, const std::string& origin,
                            int64_t tensor_parallel, int64_t pipeline_stages,
                            const std::vector<int64_t>& pipeline_held, int64_t expert_parallel) {
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
  const Reader reader(json, origin);
  if (const auto whole = multi_stack().find(type); whole != multi_stack().end()) {
    if (tensor_parallel > 1 || pipeline_stages > 1 || expert_parallel > 1) {
      fail(
          "{}: tensor-parallel size {}, {} pipeline stages and expert-parallel size {} for "
          "model_type '{}'; allowed: 1 of each for it (what they split is planned for the "
          "decoder families: {})",
          origin, tensor_parallel, pipeline_stages, expert_parallel, type,
          fmt::join(decoder_types(), ", "));
    }
    return whole->second(reader);
  }
  const auto family = decoders().find(type);
  if (family == decoders().end()) {
    fail("{}: model_type '{}' is not supported; allowed: {} (or give --params and the shape)",
         origin, type, fmt::format("{}", fmt::join(supported_model_types(), ", ")));
  }
  TransformerArch arch = family->second(reader);
  arch.tensor_parallel = tensor_parallel;
  arch.pipeline_stages = pipeline_stages;
  arch.pipeline_held = pipeline_held;
  arch.expert_parallel = expert_parallel;
  return spec_from_arch(arch, type, origin);
}

ModelSpec spec_from_hf_file(const std::string& path, int64_t tensor_parallel,
                            int64_t pipeline_stages, const std::vector<int64_t>& pipeline_held,
                            int64_t expert_parallel) {
  return spec_from_hf_json(read_whole_file(path, "--hf-config"), path, tensor_parallel,
                           pipeline_stages, pipeline_held, expert_parallel);
}

ModelSpec spec_from_hf_model(const std::string& json_text, const std::string& attn_implementation,
                             int64_t tensor_parallel) {
  ModelSpec spec = spec_from_hf_json(json_text, "model.config", tensor_parallel);
  spec.attention_scores = attention_keeps_scores(attn_implementation, "attn_implementation");
  return spec;
}

}  // namespace zeroshard
