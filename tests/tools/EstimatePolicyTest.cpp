// zeroshard-estimate's activation policies run as a user runs them: the largest
// micro-batch each choice fits, and --ac-mode auto's blocks recomputed beside each figure.
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/tools/EstimateCli.h"

using namespace zeroshard::testing;

TEST(EstimatePolicy, MaxMicroBatchIsTheLargestEachChoiceFitsAndGrowsWithOffload) {
  // Each choice's --max-micro-batch fits at that --micro-batch and not one more; with the
  // blocks' activations offloaded to the host the device holds two blocks' and the head's,
  // so every choice that fits one sequence fits more of them.
  const std::string model = "--hf-config " + hf("llama2_7b.json") +
                            " --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 2TB --seq 4096 "
                            "--ac-mode full --json";
  std::map<std::string, std::vector<int64_t>> largest;
  for (const std::string offload : {"none", "cpu"}) {
    const std::string args = model + " --ac-offload " + offload;
    const CliRun r = estimate(args + " --max-micro-batch");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto options = nlohmann::json::parse(r.out)["options"];
    for (size_t i = 0; i < options.size(); ++i) {
      const int64_t batch = options[i]["max_micro_batch"].get<int64_t>();
      largest[offload].push_back(batch);
      if (batch == 0 || offload == "cpu") continue;
      for (const int64_t micro : {batch, batch + 1}) {
        const CliRun at = estimate(args + " --micro-batch " + std::to_string(micro));
        ASSERT_NE(at.code, 2) << at.err;
        EXPECT_EQ(nlohmann::json::parse(at.out)["options"][i]["fits"].get<bool>(), micro == batch)
            << "option " << i << " at micro-batch " << micro;
      }
    }
  }
  EXPECT_EQ(largest["none"][0], 0);  // stage 0's model states alone exceed 80 GB
  for (size_t i = 1; i < largest["none"].size(); ++i)
    if (largest["none"][i] > 0) {
      EXPECT_GT(largest["cpu"][i], largest["none"][i]) << "option " << i;
    }
  const CliRun table = estimate(model.substr(0, model.size() - 7) + " --max-micro-batch");
  EXPECT_NE(table.out.find("largest micro-batch (--max-micro-batch) at 4,096 tokens, activation "
                           "checkpointing full:"),
            std::string::npos)
      << table.out;
}

TEST(EstimatePolicy, AutoRecomputesTheFewestBlocksEachChoiceFitsWith) {
  // Llama-2-7B, 32 blocks, on 8 x 80 GB at 16,384 tokens: each stage without offload fits
  // with some blocks recomputed, fewer the more it shards (stage 0 not even with all); the
  // longest sequence of each choice is full's (every block recomputed keeps the least),
  // and there it recomputes all 32.
  const std::string model = "--hf-config " + hf("llama2_7b.json") +
                            " --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 2TB --micro-batch 1 "
                            "--seq 16384 --json --max-seq";
  std::map<std::string, nlohmann::json> runs;
  for (const std::string mode : {"full", "auto"}) {
    const CliRun r = estimate(model + " --ac-mode " + mode);
    ASSERT_EQ(r.code, 0) << r.err;
    runs[mode] = nlohmann::json::parse(r.out)["options"];
  }
  const auto& options = runs["auto"];
  for (size_t i = 0; i < options.size(); ++i) {
    EXPECT_EQ(options[i]["max_seq"], runs["full"][i]["max_seq"]) << "option " << i;
    if (options[i]["max_seq"].get<int64_t>() > 0) {
      EXPECT_EQ(options[i]["max_seq_recomputed_blocks"], 32) << "option " << i;
    }
  }
  EXPECT_FALSE(options[0]["fits"].get<bool>());
  EXPECT_EQ(options[0]["recomputed_blocks"], 32);
  int64_t before = 32;
  for (size_t stage = 1; stage <= 3; ++stage) {
    ASSERT_TRUE(options[stage]["fits"].get<bool>()) << "stage " << stage;
    const int64_t k = options[stage]["recomputed_blocks"].get<int64_t>();
    EXPECT_GT(k, 0) << "stage " << stage;
    EXPECT_LT(k, before) << "stage " << stage;
    before = k;
  }
  EXPECT_TRUE(options[3]["recommended"].get<bool>());  // the fewest, before any offload
  const CliRun table =
      estimate("--hf-config " + hf("llama2_7b.json") +
               " --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 2TB --seq 16384 --ac-mode auto");
  EXPECT_NE(table.out.find("activation checkpointing auto (the fewest blocks recomputed that "
                           "fit)"),
            std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("of the choices without offload, the one recomputing the fewest "
                           "blocks"),
            std::string::npos)
      << table.out;
}

TEST(EstimatePolicy, TiledComputeTrainsLongerSequencesAndSaysSo) {
  // Llama-2-7B over 8 sequence-parallel ranks, every block recomputed: past the blocks'
  // inputs, an MLP's intermediates while its block is recomputed and the head's 32,000-wide
  // logits bound the sequence; tiled, both are a tile's, so each choice trains a longer one.
  const std::string model = "--hf-config " + hf("llama2_7b.json") +
                            " --gpus-per-node 8 --sp 8 --gpu-mem 80GB --cpu-mem 2TB --ac-mode full "
                            "--max-seq";
  const CliRun plain = estimate(model + " --json");
  const CliRun tiled = estimate(model + " --tiled-mlp 8 --tiled-logits 8 --json");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(tiled.code, 0) << tiled.err;
  const auto plain_options = nlohmann::json::parse(plain.out)["options"];
  const auto tiled_options = nlohmann::json::parse(tiled.out)["options"];
  ASSERT_EQ(plain_options.size(), tiled_options.size());
  for (size_t i = 0; i < plain_options.size(); ++i) {
    const int64_t before = plain_options[i]["max_seq"].get<int64_t>();
    if (before == 0) continue;
    EXPECT_GT(tiled_options[i]["max_seq"].get<int64_t>(), before) << i;
  }
  const CliRun text = estimate(model + " --tiled-mlp 8 --tiled-logits 8");
  EXPECT_NE(text.out.find("activation checkpointing full, MLP in 8 tiles, logits and loss in 8 "
                          "tiles"),
            std::string::npos)
      << text.out;
}
