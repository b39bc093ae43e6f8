// plan/Exchanges.h against counts made by hand from the exchanges' code
// (bindings/zeroshard/_experts/hf_expert_parallel.py, _sequence/ulysses_hf.py, and torch's
// ring attention, which _sequence/context_parallel.py runs).
#include "plan/Exchanges.h"

#include <string>

#include <gtest/gtest.h>

#include "plan/HfConfig.h"
#include "tests/common/TestPaths.h"

namespace zeroshard {
namespace {

ModelSpec hf(const std::string& name, int64_t expert_parallel = 1) {
  return spec_from_hf_file(std::string(testing::source_dir()) + "/tests/data/hf/" + name, 1, 1, {0},
                           expert_parallel);
}

TEST(Exchanges, ExpertsSendEveryRouteTheirWayAndBackEachWay) {
  // Mixtral-8x7B at ep 8, 4,096 tokens of a micro-batch of 1, top 2, bf16: 8,192 routes of
  // 4,096 elements (2 bytes) each way; the counts (8 x int64) and each route's expert place
  // (int64) forward; both row exchanges reversed in backward; 32 MoE layers.
  TrainingShape shape;
  shape.seq = 4096;
  const Exchanges x = exchanges_of(hf("mixtral_8x7b.json", 8), shape, 8, 2);
  const int64_t rows = int64_t{8192} * 4096 * 2;
  EXPECT_EQ(x.experts.layers, 32);
  EXPECT_EQ(x.experts.ranks, 8);
  EXPECT_EQ(x.experts.forward_bytes, 8 * 8 + 2 * rows + 8192 * 8);
  EXPECT_EQ(x.experts.backward_bytes, 2 * rows);
  EXPECT_EQ(x.experts.forward_passes, 32);
  EXPECT_EQ(x.experts.micro_step_bytes(), 32 * (8 * 8 + 4 * rows + 8192 * 8));
  EXPECT_EQ(x.sequence.layers, 0);
  // Every block recomputed: each MoE layer's forward exchanges twice.
  shape.recomputed.whole = 32;
  EXPECT_EQ(exchanges_of(hf("mixtral_8x7b.json", 8), shape, 8, 2).experts.forward_passes, 64);
  // Without expert parallelism nothing is exchanged.
  EXPECT_EQ(exchanges_of(hf("mixtral_8x7b.json"), shape, 1, 2).experts.layers, 0);
}

TEST(Exchanges, UlyssesSendsQueriesKeysValuesAndTheOutputEachWay) {
  // Llama-2-7B (32 heads of 128, 32 key-value heads) at sp 4, 16,384 tokens, bf16: each
  // rank's slice is 4,096 tokens; a head of it 4,096 x 128 x 2 bytes; q, k, v and the
  // output are 32 heads each; the positions (int64) gathered forward.
  TrainingShape shape;
  shape.seq = 16384;
  shape.sequence_parallel = 4;
  const ModelSpec llama = hf("llama2_7b.json");
  const int64_t head = int64_t{4096} * 128 * 2;
  const Exchanges x = exchanges_of(llama, shape, 1, 2);
  EXPECT_EQ(x.sequence.layers, 32);
  EXPECT_EQ(x.sequence.forward_bytes, 4096 * 8 + 128 * head);
  EXPECT_EQ(x.sequence.backward_bytes, 128 * head);
  EXPECT_EQ(x.sequence.micro_step_bytes(), 32 * (4096 * 8 + 256 * head));
  EXPECT_EQ(x.experts.layers, 0);
  // Key-value heads fewer than the ranks are repeated to one a rank: Mistral's 8 at sp 16
  // exchange 16 each (32 query heads), its slices 1,024 tokens.
  shape.sequence_parallel = 16;
  shape.recomputed.ops = 32;  // selective recomputation repeats the exchanges too
  const Exchanges m = exchanges_of(hf("mistral_7b.json"), shape, 1, 2);
  const int64_t mhead = int64_t{1024} * 128 * 2;
  EXPECT_EQ(m.sequence.backward_bytes, (2 * 32 + 2 * 16) * mhead);
  EXPECT_EQ(m.sequence.forward_passes, 64);
  EXPECT_EQ(m.ring.layers, 0);
}

TEST(Exchanges, TheRingGathersKeysAndValuesEachWayAndPassesTheirGradientsAround) {
  // Mistral-7B (8 key-value heads of 128) at cp 4, 16,384 tokens, bf16: each rank's slice is
  // 4,096 tokens, its keys and values 4,096 x 2 x 8 x 128 elements, not repeated. Forward:
  // one all-gather of them; backward: one more, and their gradients (fp32) passed to the
  // next rank once per rank of the ring (4 times).
  TrainingShape shape;
  shape.seq = 16384;
  shape.sequence_parallel = 4;
  shape.ring_attention = true;
  const int64_t kv = int64_t{4096} * 2 * 8 * 128;
  const Exchanges x = exchanges_of(hf("mistral_7b.json"), shape, 1, 2);
  EXPECT_EQ(x.sequence.layers, 0);
  EXPECT_EQ(x.ring.layers, 32);
  EXPECT_EQ(x.ring.ranks, 4);
  EXPECT_EQ(x.ring.forward_bytes, kv * 2);
  EXPECT_EQ(x.ring.backward_bytes, kv * 2 + 4 * kv * 4);
  EXPECT_EQ(x.ring.micro_step_bytes(), 32 * (kv * 4 + 16 * kv));
  // Recomputed blocks gather again in their second forward.
  shape.activation_checkpointing = true;
  EXPECT_EQ(exchanges_of(hf("mistral_7b.json"), shape, 1, 2).ring.forward_passes, 64);
}

}  // namespace
}  // namespace zeroshard
