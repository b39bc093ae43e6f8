#include "plan/HfConfig.h"

#include <gtest/gtest.h>

#include "common/Error.h"

using namespace zeroshard;

namespace {

std::string data(const std::string& name) {
  return std::string(ZS_SOURCE_DIR) + "/tests/data/hf/" + name;
}

std::string error_of(const std::string& json) {
  try {
    spec_from_hf_json(json, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Published totals of the released checkpoints (model cards / num_parameters()).
TEST(HfConfig, PublishedParameterCounts) {
  EXPECT_EQ(spec_from_hf_file(data("gpt2.json")).total_params, 124'439'808);
  EXPECT_EQ(spec_from_hf_file(data("llama2_7b.json")).total_params, 6'738'415'616);
  EXPECT_EQ(spec_from_hf_file(data("mistral_7b.json")).total_params, 7'241'732'096);
  EXPECT_EQ(spec_from_hf_file(data("qwen2_0_5b.json")).total_params, 494'032'768);
}

TEST(HfConfig, OtherFamiliesPublishedCounts) {
  // Mixtral-8x7B-v0.1
  EXPECT_EQ(spec_from_hf_json(R"({"model_type": "mixtral", "vocab_size": 32000,
      "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
      "tie_word_embeddings": false})",
                              "mixtral")
                .total_params,
            46'702'792'704);
  // gemma-7b
  EXPECT_EQ(spec_from_hf_json(R"({"model_type": "gemma", "vocab_size": 256000,
      "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
      "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576})",
                              "gemma")
                .total_params,
            8'537'680'896);
  // phi-2
  EXPECT_EQ(spec_from_hf_json(R"({"model_type": "phi", "vocab_size": 51200,
      "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
      "intermediate_size": 10240, "tie_word_embeddings": false})",
                              "phi")
                .total_params,
            2'779'683'840);
  // pythia-160m (gpt_neox)
  EXPECT_EQ(spec_from_hf_json(R"({"model_type": "gpt_neox", "vocab_size": 50304,
      "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
      "intermediate_size": 3072, "max_position_embeddings": 2048,
      "tie_word_embeddings": false})",
                              "neox")
                .total_params,
            162'322'944);
}

TEST(HfConfig, UnitsAndLargestModule) {
  const ModelSpec s = spec_from_hf_file(data("llama2_7b.json"));
  ASSERT_EQ(s.unit_params.size(), 33u);  // 32 blocks + the root unit
  // One block: 4 x 4096^2 attention + 3 x 4096 x 11008 MLP + 2 x 4096 norms.
  EXPECT_EQ(s.unit_params[0], 202'383'360);
  // Root: embedding + untied lm_head + final norm.
  EXPECT_EQ(s.unit_params.back(), 2 * 32000 * 4096 + 4096);
  EXPECT_EQ(s.largest_unit(), 262'148'096);
  EXPECT_EQ(s.largest_module_params, 32000 * 4096);
  // Norm weights (4096) are the only tensors under a 10 x hidden threshold.
  EXPECT_EQ(s.persistent_params(40960), 65 * 4096);
  EXPECT_EQ(s.max_positions, 4096);
  int64_t sum = 0;
  for (int64_t u : s.unit_params) sum += u;
  EXPECT_EQ(sum, s.total_params);
}

TEST(HfConfig, TiedEmbeddingsCountOnce) {
  const ModelSpec s = spec_from_hf_file(data("qwen2_0_5b.json"));
  EXPECT_EQ(s.unit_params.back(), 151936 * 896 + 896);
}

TEST(HfConfig, ClearErrors) {
  EXPECT_NE(error_of(R"({"model_type": "t5"})").find("model_type 't5' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "t5"})").find("llama"), std::string::npos);
  EXPECT_NE(error_of(R"({"vocab_size": 3})").find("'model_type' is missing"), std::string::npos);
  const std::string missing = error_of(R"({"model_type": "llama", "vocab_size": 32000,
      "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 8})");
  EXPECT_NE(missing.find("key 'hidden_size' is missing"), std::string::npos) << missing;
  EXPECT_NE(error_of("{not json").find("config.json: not valid JSON"), std::string::npos);
  const std::string negative = error_of(R"({"model_type": "gpt2", "vocab_size": -1,
      "n_embd": 8, "n_layer": 1, "n_head": 1, "n_positions": 8})");
  EXPECT_NE(negative.find("'vocab_size' is -1"), std::string::npos) << negative;
  EXPECT_THROW(spec_from_hf_file("/nonexistent/config.json"), Error);
}

TEST(HfConfig, ExplicitNumbers) {
  ExplicitModel m;
  m.params = 7'000'000'000;
  const ModelSpec bare = spec_from_numbers(m);
  EXPECT_EQ(bare.total_params, 7'000'000'000);
  EXPECT_EQ(bare.largest_unit(), 7'000'000'000);  // one unit when nothing else is known
  EXPECT_FALSE(bare.has_shape());
  m.layers = 32;
  m.hidden = 4096;
  m.heads = 32;
  m.vocab = 32000;
  m.intermediate = 11008;
  const ModelSpec shaped = spec_from_numbers(m);
  EXPECT_EQ(shaped.total_params, 7'000'000'000);
  EXPECT_EQ(shaped.unit_params[0], 202'383'360);
  EXPECT_EQ(shaped.unit_params.back(), 7'000'000'000 - 32 * int64_t{202'383'360});
  EXPECT_TRUE(shaped.has_shape());
  m.params = 1'000'000;
  EXPECT_THROW(spec_from_numbers(m), Error);
  EXPECT_THROW(spec_from_numbers(ExplicitModel{}), Error);
}
