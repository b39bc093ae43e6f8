#include "plan/HfConfig.h"

#include <gtest/gtest.h>

#include "common/Error.h"
#include "tests/common/TestPaths.h"

using namespace zeroshard;

namespace {

std::string data(const std::string& name) {
  return std::string(zeroshard::testing::source_dir()) + "/tests/data/hf/" + name;
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

TEST(HfConfig, UnitsAsStageThreeCutsTheModel) {
  const ModelSpec s = spec_from_hf_file(data("llama2_7b.json"));
  // engine/UnitPartition.h's units: the embedding, 32 blocks, the final norm, the head.
  ASSERT_EQ(s.unit_params.size(), 35u);
  EXPECT_EQ(s.unit_params[0], 32000 * 4096);
  // One block: 4 x 4096^2 attention + 3 x 4096 x 11008 MLP + 2 x 4096 norms.
  EXPECT_EQ(s.unit_params[1], 202'383'360);
  EXPECT_EQ(s.unit_params[33], 4096);
  EXPECT_EQ(s.unit_params[34], 32000 * 4096);
  EXPECT_EQ(s.largest_unit(), 202'383'360);
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
  // The head is the embedding: one unit, no unit of its own.
  EXPECT_EQ(s.unit_params.front(), 151936 * 896);
  EXPECT_EQ(s.unit_params.size(), 1u + 24 + 1);
}

// Published totals (num_parameters() of the released checkpoints) of the families whose
// units are not one stack's: an encoder-decoder, experts beside attention, a vision tower
// joined to a language model; and each one's units.
TEST(HfConfig, MultiStackFamilies) {
  // t5-small: the encoder's and the decoder's first blocks hold the position bias.
  const ModelSpec t5 = spec_from_hf_json(R"({"model_type": "t5", "vocab_size": 32128,
      "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
      "relative_attention_num_buckets": 32, "feed_forward_proj": "relu"})",
                                         "t5");
  EXPECT_EQ(t5.total_params, 60'506'624);
  ASSERT_EQ(t5.unit_params.size(), 1u + 6 + 1 + 6 + 1);  // shared (the head), stacks, norms
  EXPECT_EQ(t5.unit_params[1], t5.unit_params[2] + 8 * 32);
  // gemma-2-2b: four norms a block, the head tied.
  EXPECT_EQ(spec_from_hf_json(R"({"model_type": "gemma2", "vocab_size": 256000,
      "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
      "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216})",
                              "gemma2")
                .total_params,
            2'614'341'888);
  // Qwen3-30B-A3B: 128 experts of 768 and query/key norms in every block.
  EXPECT_EQ(spec_from_hf_json(R"({"model_type": "qwen3_moe", "vocab_size": 151936,
      "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
      "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
      "moe_intermediate_size": 768, "num_experts": 128, "decoder_sparse_step": 1,
      "mlp_only_layers": [], "tie_word_embeddings": false})",
                              "qwen3_moe")
                .total_params,
            30'532'122'624);
  // llava-1.5-7b: CLIP ViT-L/14 at 336 pixels, a two-layer projector, a Llama.
  const ModelSpec llava = spec_from_hf_json(R"({"model_type": "llava",
      "vision_feature_layer": -2,
      "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024,
        "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
        "image_size": 336, "patch_size": 14},
      "text_config": {"model_type": "llama", "vocab_size": 32064, "hidden_size": 4096,
        "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32}})",
                                            "llava");
  EXPECT_EQ(llava.total_params, 7'063'427'072);
  // Embeddings, norm, 24 blocks, norm; projector; embedding, 32 blocks, norm, head.
  EXPECT_EQ(llava.unit_params.size(), 3u + 24 + 1 + 1 + 32 + 2);
  EXPECT_EQ(llava.layers, 32);  // activations: the language model's
}

TEST(HfConfig, ClearErrors) {
  EXPECT_NE(error_of(R"({"model_type": "bert"})").find("model_type 'bert' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "bert"})").find("llama"), std::string::npos);
  const std::string vision = error_of(R"({"model_type": "llava", "text_config": {},
      "vision_config": {"model_type": "siglip_vision_model"}})");
  EXPECT_NE(vision.find("config.json (vision_config): model_type 'siglip_vision_model' is not a "
                        "supported vision tower"),
            std::string::npos)
      << vision;
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
