// plan/PipelineStages and a decoder's spec split over pipeline stages: the blocks each
// stage holds, the micro-batches it keeps, and its parameters and activations against
// counts derived by hand.
#include "plan/PipelineStages.h"

#include <string>

#include <gtest/gtest.h>

#include "common/Error.h"
#include "plan/HfConfig.h"
#include "plan/MemoryModel.h"

using namespace zeroshard;

namespace {

using Blocks = std::pair<int64_t, int64_t>;

const std::string kLlama7b = R"({"model_type": "llama", "vocab_size": 32000,
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096})";

// gpt2: a tied head, learned positions.
const std::string kGpt2 = R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
    "n_layer": 12, "n_head": 12, "n_positions": 1024})";

}  // namespace

TEST(PipelineStages, BlocksAreSharedEvenlyTheFirstStagesTakingTheRest) {
  EXPECT_EQ(stage_blocks(32, 4, 0), Blocks(0, 8));
  EXPECT_EQ(stage_blocks(32, 4, 3), Blocks(24, 8));
  // 10 over 4: 3, 3, 2, 2 (DeepSpeed's partition_uniform)
  EXPECT_EQ(stage_blocks(10, 4, 0), Blocks(0, 3));
  EXPECT_EQ(stage_blocks(10, 4, 1), Blocks(3, 3));
  EXPECT_EQ(stage_blocks(10, 4, 2), Blocks(6, 2));
  EXPECT_EQ(stage_blocks(10, 4, 3), Blocks(8, 2));
  EXPECT_EQ(stage_blocks(7, 1, 0), Blocks(0, 7));
}

TEST(PipelineStages, OneF1BHoldsAtMostTheStagesAheadGPipeEveryMicroBatch) {
  for (int64_t s = 0; s < 4; ++s) {
    EXPECT_EQ(micro_batches_in_flight("1f1b", 4, s, 8, "--pp-schedule"), 4 - s);
    EXPECT_EQ(micro_batches_in_flight("gpipe", 4, s, 8, "--pp-schedule"), 8);
  }
  EXPECT_EQ(micro_batches_in_flight("1f1b", 4, 0, 2, "--pp-schedule"), 2);  // fewer than stages
  try {
    micro_batches_in_flight("zbv", 4, 0, 8, "--pp-schedule");
    FAIL() << "an unknown schedule";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--pp-schedule: 'zbv' is not allowed; allowed: 1f1b, "
                                         "gpipe, interleaved1f1b or loopedbfs"),
              std::string::npos)
        << e.what();
  }
}

// Llama-2-7B over 4 stages: a block is q, k, v, o 4*4096^2 + gate, up, down 3*4096*11008
// + 2 norms of 4096 = 202,383,360; the embedding and the untied head 32000*4096 each.
TEST(PipelineStages, EachStageHoldsItsBlocksTheFirstTheEmbeddingTheLastTheHead) {
  const int64_t block = 202'383'360, table = 32'000LL * 4096;
  const ModelSpec whole = spec_from_hf_json(kLlama7b, "llama");
  int64_t sum = 0;
  for (int64_t stage = 0; stage < 4; ++stage) {
    const ModelSpec s = spec_from_hf_json(kLlama7b, "llama", 1, 4, {stage});
    EXPECT_EQ(s.layers, 8);
    EXPECT_EQ(s.has_head, stage == 3);
    sum += s.total_params;
  }
  EXPECT_EQ(spec_from_hf_json(kLlama7b, "llama", 1, 4, {0}).total_params, table + 8 * block);
  EXPECT_EQ(spec_from_hf_json(kLlama7b, "llama", 1, 4, {1}).total_params, 8 * block);
  EXPECT_EQ(spec_from_hf_json(kLlama7b, "llama", 1, 4, {3}).total_params, 8 * block + 4096 + table);
  EXPECT_EQ(sum, whole.total_params);
  // A tied head keeps a copy of the embedding on the last stage (DeepSpeed's TiedLayerSpec):
  // the stages hold the table twice between them.
  const ModelSpec gpt2 = spec_from_hf_json(kGpt2, "gpt2");
  const int64_t first = spec_from_hf_json(kGpt2, "gpt2", 1, 2, {0}).total_params;
  const int64_t last = spec_from_hf_json(kGpt2, "gpt2", 1, 2, {1}).total_params;
  EXPECT_EQ(first + last, gpt2.total_params + 50'257LL * 768);
  try {
    spec_from_hf_json(kLlama7b, "llama", 1, 33, {0});
    FAIL() << "more stages than blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("33 pipeline stages for 32 layers; allowed: 1 to 32"),
              std::string::npos)
        << e.what();
  }
}

// A stage's activations: its own blocks', once per micro-batch in flight, and the logits
// only on the last stage.
TEST(PipelineStages, ActivationsCountTheStagesBlocksForEachMicroBatchInFlight) {
  const ModelSpec whole = spec_from_hf_json(kLlama7b, "llama");
  const ModelSpec first = spec_from_hf_json(kLlama7b, "llama", 1, 4, {0});
  const ModelSpec last = spec_from_hf_json(kLlama7b, "llama", 1, 4, {3});
  TrainingShape one{2048, 1, false};
  const int64_t whole_bytes = activation_bytes(whole, one, 2);
  const int64_t head = activation_bytes(last, one, 2) - activation_bytes(first, one, 2);
  EXPECT_GT(head, 0);  // the logits, on the last stage alone
  EXPECT_EQ(4 * activation_bytes(first, one, 2) + head, whole_bytes);
  TrainingShape three = one;
  three.in_flight = 3;
  EXPECT_EQ(activation_bytes(first, three, 2), 3 * activation_bytes(first, one, 2));
}

// torch's Interleaved1F1B on 2 ranks x 2 stages, 4 micro-batches (2 rounds of 2): rank 0
// warms up with (2 - 1) x 2 + 2 x (2 - 1 - 0) = 4 forwards (F0 F0 F1 F1), then F0 B1 F0 B1
// F1 B0 F1 B0, then B1 B1 B0 B0; rank 1 with 2 (F0 F0), then F1 B1 F1 B1 F0 B0 F0 B0, then
// B1 B1... by hand from its formulas: the most held is warm-up + 1.
TEST(PipelineStages, InterleavedOneF1BHoldsItsWarmUpAndOneMore) {
  EXPECT_EQ(stages_of_rank(2, 2, 0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(stages_of_rank(2, 2, 1), (std::vector<int64_t>{1, 3}));
  const auto rank0 = parts_in_flight("interleaved1f1b", 2, 2, 0, 4, "--pp-schedule");
  ASSERT_EQ(rank0.size(), 16u);                            // 8 forwards and 8 backwards
  EXPECT_EQ(rank0[3].held, (std::vector<int64_t>{2, 2}));  // after the warm-up
  EXPECT_EQ(rank0[4].held, (std::vector<int64_t>{3, 2}));  // its most
  EXPECT_EQ(rank0[5].held, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(most_in_flight(rank0), 5);
  EXPECT_EQ(rank0.back().held, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(rank0.back().forwarded, (std::vector<int64_t>{4, 4}));
  const auto rank1 = parts_in_flight("interleaved1f1b", 2, 2, 1, 4, "--pp-schedule");
  EXPECT_EQ(rank1[2].held, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(most_in_flight(rank1), 3);
  // LoopedBFS: every forward of both stages before any backward.
  EXPECT_EQ(most_in_flight(parts_in_flight("loopedbfs", 2, 2, 1, 4, "--pp-schedule")), 8);
  try {
    parts_in_flight("interleaved1f1b", 4, 2, 0, 6, "--pp-schedule");  // 1 round of 6: fine
    parts_in_flight("interleaved1f1b", 2, 2, 0, 5, "--pp-schedule");  // 2 rounds of 5: not
    FAIL() << "micro-batches not a multiple of the rounds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interleaved1f1b with 5 micro-batches over 2 ranks; "
                                         "allowed: a multiple of its rounds (2)"),
              std::string::npos)
        << e.what();
  }
}

// A rank holding stages 0 and 2 of 4 (Llama-2-7B's 32 blocks, 8 each): the embedding and 16
// blocks; the other rank 16 blocks, the final norm and the head. Its activations at the
// interleaved peak: 5 micro-batches on stages of one stage's bytes each.
TEST(PipelineStages, ARankOfSeveralStagesHoldsTheirsAndTheirActivationsAlongTheOrder) {
  const int64_t block = 202'383'360, table = 32000LL * 4096;
  const ModelSpec first = spec_from_hf_json(kLlama7b, "llama", 1, 4, {0, 2});
  const ModelSpec second = spec_from_hf_json(kLlama7b, "llama", 1, 4, {1, 3});
  EXPECT_EQ(first.total_params, table + 16 * block);
  EXPECT_EQ(second.total_params, 16 * block + 4096 + table);
  EXPECT_EQ(first.layers, 16);
  EXPECT_FALSE(first.has_head);
  EXPECT_TRUE(second.has_head);
  TrainingShape one{2048, 1, false};
  one.pipeline_micro_batches = 4;  // one stage of 8 blocks, one micro-batch in flight
  const int64_t stage = activation_bytes(spec_from_hf_json(kLlama7b, "llama", 1, 4, {0}), one, 2);
  TrainingShape parts = one;
  parts.part_layers = {8, 8};
  parts.part_steps = parts_in_flight("interleaved1f1b", 2, 2, 0, 4, "--pp-schedule");
  EXPECT_EQ(activation_bytes(first, parts, 2), 5 * stage);
}
