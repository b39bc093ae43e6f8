// zeroshard-estimate run as a user runs it: a real process, its exit code and output.
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/Config.h"
#include "tests/tools/EstimateCli.h"

namespace fs = std::filesystem;
using namespace zeroshard::testing;

namespace {

const std::string kLlama8x80 = "--hf-config " + hf("llama2_7b.json") +
                               " --nodes 1 --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 512GB "
                               "--nvme 2TB --seq 4096 --micro-batch 1 --activation-checkpointing";

}  // namespace

TEST(EstimateCli, JsonHasExactParametersAndEveryOption) {
  const CliRun r = estimate(kLlama8x80 + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["parameters"].get<int64_t>(), 6'738'415'616);
  ASSERT_EQ(j["options"].size(), 14u);
  int recommended = 0;
  for (const auto& o : j["options"]) {
    recommended += o["recommended"].get<bool>();
    int64_t device_sum = 0;
    for (const auto& [kind, bytes] : o["bytes_by_kind"]["device"].items())
      device_sum += bytes.get<int64_t>();
    EXPECT_EQ(device_sum, o["bytes"]["device"].get<int64_t>());
    EXPECT_TRUE(o.contains("stage") && o.contains("offload_optimizer") && o.contains("fits"));
  }
  EXPECT_EQ(recommended, 1);
  // Stage 0 holds 20 bytes per parameter of model states alone: 134.8 GB > 80 GB.
  EXPECT_FALSE(j["options"][0]["fits"].get<bool>());
  EXPECT_TRUE(j["fits"].get<bool>());
}

TEST(EstimateCli, MaxSeqIsTheLongestSequenceEachChoiceFitsAndSplitsOverSp) {
  // Each choice's --max-seq fits at that --seq and not one --sp step longer; split over 8
  // sequence-parallel ranks the lengths are multiples of 8 and longer than on one.
  const std::string model = "--hf-config " + hf("llama2_7b.json") +
                            " --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 1TB --micro-batch 1 "
                            "--activation-checkpointing --json";
  std::map<int64_t, std::vector<int64_t>> longest;
  for (const int64_t sp : {1, 8}) {
    const std::string args = model + " --sp " + std::to_string(sp);
    const CliRun r = estimate(args + " --max-seq");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto options = nlohmann::json::parse(r.out)["options"];
    for (size_t i = 0; i < options.size(); ++i) {
      const int64_t tokens = options[i]["max_seq"].get<int64_t>();
      longest[sp].push_back(tokens);
      if (tokens == 0) continue;
      EXPECT_EQ(tokens % sp, 0);
      for (const int64_t seq : {tokens, tokens + sp}) {
        const CliRun at = estimate(args + " --seq " + std::to_string(seq));
        ASSERT_NE(at.code, 2) << at.err;
        EXPECT_EQ(nlohmann::json::parse(at.out)["options"][i]["fits"].get<bool>(), seq == tokens)
            << "option " << i << " at seq " << seq;
      }
    }
  }
  EXPECT_EQ(longest[1][0], 0);  // stage 0's model states alone exceed 80 GB
  for (size_t i = 1; i < longest[1].size(); ++i)
    if (longest[1][i] > 0) {
      EXPECT_GT(longest[8][i], 4 * longest[1][i]) << "option " << i;
    }
  const CliRun table = estimate(model.substr(0, model.size() - 7) + " --sp 8 --max-seq");
  EXPECT_NE(table.out.find("longest sequence (--max-seq) at micro-batch 1, split over 8 ranks, "
                           "activation checkpointing on:"),
            std::string::npos)
      << table.out;
}

TEST(EstimateCli, TableMarksTheRecommendedPlanAndShowsDeepSpeed) {
  const CliRun r = estimate(kLlama8x80);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("parameters: 6,738,415,616"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n* stage"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recommended: stage 1"), std::string::npos) << r.out;
  // DeepSpeed ZeRO-2 for 6,738,415,616 params on 8 GPUs: 4P + 16P/8 = 37.65 GiB.
  EXPECT_NE(r.out.find("37.65 / "), std::string::npos) << r.out;
}

TEST(EstimateCli, EmittedConfigLoadsAndMatchesThePlan) {
  const fs::path out = scratch() / "plan.yaml";
  const CliRun r = estimate(kLlama8x80 + " --emit-config " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto loaded = zeroshard::load_config_file(out.string());
  EXPECT_EQ(loaded.config.zero.stage, 1);
  EXPECT_TRUE(loaded.config.bf16);
  EXPECT_EQ(loaded.config.zero.reduce_bucket_size, 4096 * 4096);
}

TEST(EstimateCli, ConfigFileFixesTheStage) {
  const CliRun r = estimate(kLlama8x80 + " --json --config " +
                            std::string(zeroshard::testing::source_dir()) + "/configs/zero3.yaml");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& o : j["options"]) {
    if (o["recommended"].get<bool>()) {
      EXPECT_EQ(o["stage"].get<int>(), 3);
    }
  }
}

TEST(EstimateCli, ExplicitNumbersAndDefaultsAreShown) {
  const CliRun r =
      estimate("--params 7e9 --layers 32 --hidden 4096 --heads 32 --vocab 32000 --gpus-per-node 8");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("parameters: 7,000,000,000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("assumed (not given): "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 node"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention sdpa, transformers' default"), std::string::npos) << r.out;
}

// Llama-2 7B at tp 8 over 2 nodes of 8: per layer 4 x 4096^2 attention and 3 x 4096 x 11008
// MLP elements are split, and the 32000 x 4096 head; the embedding and the norms are not.
TEST(EstimateCli, TensorParallelCountsOneRanksSlicesAndShardsOverTheRest) {
  const CliRun r = estimate("--hf-config " + hf("llama2_7b.json") +
                            " --nodes 2 --gpus-per-node 8 --tp 8 --json --seq 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const int64_t split = 32 * (4 * 4096LL * 4096 + 3 * 4096LL * 11008) + 32000LL * 4096;
  const int64_t whole = 32000LL * 4096 + (2 * 32 + 1) * 4096;
  EXPECT_EQ(split + whole, 6'738'415'616);
  EXPECT_EQ(j["parameters"].get<int64_t>(), split / 8 + whole);
  EXPECT_EQ(j["world"]["tensor_parallel"].get<int64_t>(), 8);
  EXPECT_EQ(j["world"]["data_parallel_ranks"].get<int64_t>(), 2);
  for (const auto& o : j["options"]) {
    if (o["stage"].get<int>() != 1 || o["offload_optimizer"] != "none") continue;
    // Adam's two fp32 states of this rank's slices, sharded over the 2 data-parallel ranks.
    const double states = o["bytes_by_kind"]["device"]["optimizer_states"].get<double>();
    EXPECT_NEAR(states / (8.0 * (split / 8 + whole) / 2), 1.0, 1e-3);
  }
  const CliRun table =
      estimate("--hf-config " + hf("llama2_7b.json") + " --nodes 2 --gpus-per-node 8 --tp 8");
  EXPECT_NE(table.out.find("world: 2 node(s) x 8 rank(s) (tp 8 x dp 2)"), std::string::npos)
      << table.out;
}

// Mixtral-8x7B with its experts split over 8 ranks (--ep 8): each rank holds 1 of each
// block's 8 experts (32 x 3 x 4096 x 14336 elements of 45.1B) and every dense parameter;
// stage 3 shards the dense ones over the 8 ranks and keeps each rank's experts whole (no other
// rank holds them: edp 1); options that offload parameters are not allowed with experts split.
TEST(EstimateCli, ExpertParallelHoldsEachRanksExpertsAndShardsThemOverTheirRanks) {
  const std::string mixtral = "--hf-config " + hf("mixtral_8x7b.json") +
                              " --nodes 1 --gpus-per-node 8 --seq 1 --cpu-mem 1TB";
  const CliRun r = estimate(mixtral + " --ep 8 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const int64_t experts = 32LL * 8 * 3 * 4096 * 14336;
  const int64_t dense = 46'702'792'704 - experts;
  EXPECT_EQ(j["parameters"].get<int64_t>(), dense + experts / 8);
  EXPECT_EQ(j["world"]["expert_parallel"].get<int64_t>(), 8);
  for (const auto& o : j["options"]) {
    const double params = o["bytes_by_kind"]["device"]["params"].get<double>();
    if (o["offload_param"] != "none") {
      EXPECT_FALSE(o["allowed"].get<bool>());
    } else if (o["stage"].get<int>() < 3) {
      EXPECT_EQ(params, 2.0 * (dense + experts / 8));  // bf16, whole on every rank
    } else {
      EXPECT_NEAR(params / (2.0 * (dense / 8 + experts / 8)), 1.0, 1e-4);  // shard padding
    }
  }
  const CliRun table = estimate(mixtral + " --ep 4");
  EXPECT_NE(table.out.find("(ep 4 x edp 2)"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("per rank, 1/4 of the experts"), std::string::npos) << table.out;
  for (const auto& [args, said] : std::vector<std::pair<std::string, std::string>>{
           {"--hf-config " + hf("mixtral_8x7b.json") + " --gpus-per-node 6 --ep 3",
            "expert-parallel size 3 for 8 experts; allowed: a divisor"},
           {mixtral + " --ep 16", "--ep 16 does not divide the 8 ranks"},
           {mixtral + " --ep 2 --tp 2",
            "--ep 2 with --tp 2, --pp 1, --sp 1; allowed: expert "
            "parallelism alone with ZeRO"},
           {"--hf-config " + hf("llama2_7b.json") + " --gpus-per-node 2 --ep 2",
            "expert-parallel size 2 for 1 experts"},
           {"--params 7e9 --gpus-per-node 2 --ep 2", "--ep 2 needs the model's experts"}}) {
    const CliRun bad = estimate(args);
    EXPECT_EQ(bad.code, 2) << args;
    EXPECT_NE(bad.err.find(said), std::string::npos) << bad.err;
  }
}

// --pp 4 on 8 ranks: 4 stages of 2 data-parallel ranks, each planned on its own share of
// the blocks (plan/PipelineStages.h), 1F1B's stages holding 4, 3, 2, 1 micro-batches.
TEST(EstimateCli, PipelineStagesArePlannedEachOnItsOwnBlocks) {
  const std::string args = "--hf-config " + hf("llama2_7b.json") +
                           " --gpus-per-node 8 --pp 4 --seq 2048 --micro-batch 1 --json";
  const CliRun r = estimate(args);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["world"]["data_parallel_ranks"].get<int64_t>(), 2);
  EXPECT_EQ(j["micro_batches"].get<int64_t>(), 4);
  ASSERT_EQ(j["stages"].size(), 4u);
  int64_t params = 0;
  for (int stage = 0; stage < 4; ++stage) {
    const auto& s = j["stages"][stage];
    params += s["parameters"].get<int64_t>();
    EXPECT_EQ(s["blocks"].get<int64_t>(), 8);
    EXPECT_EQ(s["micro_batches_in_flight"].get<int64_t>(), 4 - stage);
  }
  EXPECT_EQ(params, 6'738'415'616);
  // The middle stages hold the same blocks: their activations differ by 3 to 2 micro-batches.
  const double a1 = j["stages"][1]["bytes_by_kind"]["device"]["activations"].get<double>();
  const double a2 = j["stages"][2]["bytes_by_kind"]["device"]["activations"].get<double>();
  EXPECT_DOUBLE_EQ(a1 / a2, 1.5);
  const auto gpipe = nlohmann::json::parse(estimate(args + " --pp-schedule gpipe").out);
  EXPECT_DOUBLE_EQ(gpipe["stages"][2]["bytes_by_kind"]["device"]["activations"].get<double>(),
                   2 * a2);
  const CliRun table =
      estimate("--hf-config " + hf("llama2_7b.json") + " --gpus-per-node 8 --pp 4");
  EXPECT_NE(table.out.find("pipeline: 4 stages x tp 1 x dp 2"), std::string::npos) << table.out;
}

// Interleaved1F1B on 2 ranks x 2 stages of Llama-2-7B's 32 blocks: rank 0 holds stages 0
// and 2 (blocks 0-7 and 16-23, the embedding), rank 1 stages 1 and 3 (the head); rank 0's
// peak holds 5 one-stage micro-batches of 4 (its warm-up and one more), 1F1B's stage 0 holds
// 2 of its 16 blocks: 5 x 8 against 2 x 16 blocks' activations.
TEST(EstimateCli, InterleavedStagesArePlannedPerRankAlongTheSchedulesOrder) {
  const fs::path config = scratch() / "four_micro_batches.json";
  std::ofstream(config) << R"({"gradient_accumulation_steps": 4})";
  const std::string args = "--hf-config " + hf("llama2_7b.json") +
                           " --gpus-per-node 4 --pp 2 --seq 2048 --micro-batch 1 --json" +
                           " --config " + config.string();
  const CliRun r = estimate(args + " --pp-schedule interleaved1f1b");
  ASSERT_NE(r.code, 2) << r.err;  // (the config's stage 0 may not fit: exit 1)
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stages_per_rank"].get<int64_t>(), 2);
  ASSERT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["stages"][0]["pipeline_stages_held"], nlohmann::json({0, 2}));
  EXPECT_EQ(j["stages"][0]["blocks"].get<int64_t>(), 16);
  EXPECT_EQ(j["stages"][0]["micro_batches_in_flight"].get<int64_t>(), 5);
  EXPECT_EQ(j["stages"][1]["micro_batches_in_flight"].get<int64_t>(), 3);
  EXPECT_EQ(
      j["stages"][0]["parameters"].get<int64_t>() + j["stages"][1]["parameters"].get<int64_t>(),
      6'738'415'616);
  const auto one = nlohmann::json::parse(estimate(args).out);
  const double interleaved = j["stages"][0]["bytes_by_kind"]["device"]["activations"].get<double>();
  const double plain = one["stages"][0]["bytes_by_kind"]["device"]["activations"].get<double>();
  EXPECT_NEAR(interleaved / plain, 40.0 / 32.0, 0.01);  // the embedding's input aside
  const CliRun table = estimate("--hf-config " + hf("llama2_7b.json") +
                                " --gpus-per-node 4 --pp 2 --pp-schedule interleaved1f1b");
  EXPECT_NE(table.out.find("2 stages on each (stage s on pp s % 2)"), std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("0-7,16-23"), std::string::npos) << table.out;
}

TEST(EstimateCli, NothingFitsExitsOneAndSaysWhy) {
  const CliRun r = estimate("--params 1e12 --gpu-mem 1GB --cpu-mem 1GB");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("nothing fits"), std::string::npos) << r.out;
}

TEST(EstimateCli, BadInputIsOneLineAndExitTwo) {
  const fs::path bad_json = scratch() / "bad.json";
  std::ofstream(bad_json) << "{\"model_type\": \"llama\",";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--hf-config /nonexistent/config.json", "cannot be read"},
      {"--hf-config " + bad_json.string(), "not valid JSON"},
      {"--params 7e9 --gpu-mem 80XB", "--gpu-mem: '80XB' is not a size"},
      {"--params 7e9 --gpu-mem 0", "--gpu-mem"},
      {"--params 7e9 --nodes -1", "--nodes: '-1' is not allowed"},
      {"--params 7e9 --nodes 0", "--nodes: '0'"},
      {"--params -5", "--params"},
      {"--params 7e9 --gpu-mme 80GB", "did you mean '--gpu-mem'"},
      {"", "give the model as --hf-config"},
      {"--params 7e9 --tp 2 --gpus-per-node 2", "--tp 2 needs the model's shape"},
      {"--hf-config " + hf("llama2_7b.json") + " --tp 3 --gpus-per-node 3",
       "tensor-parallel size 3 does not divide num_attention_heads (32)"},
      {"--hf-config " + hf("llama2_7b.json") + " --tp 2",
       "tensor-parallel size 2 does not divide the 1 ranks per node"},
      {"--params 7e9 --pp 2 --gpus-per-node 2",
       "--params with 2 pipeline stages: which stage holds the parameters outside the blocks"},
      {"--hf-config " + hf("llama2_7b.json") + " --pp 3 --gpus-per-node 8",
       "--pp 3 divides neither --nodes 1 nor --gpus-per-node 8"},
      {"--hf-config " + hf("llama2_7b.json") + " --pp 2 --gpus-per-node 2 --pp-schedule zb",
       "--pp-schedule: 'zb' is not allowed; allowed: 1f1b, gpipe, interleaved1f1b or loopedbfs"},
      {"--hf-config " + hf("llama2_7b.json") + " --pp 2 --gpus-per-node 2 --pp-stages-per-rank 2",
       "--pp-stages-per-rank 2 with --pp-schedule 1f1b; allowed: 1, or a schedule that runs "
       "several stages on each rank"},
      {"--hf-config " + hf("llama2_7b.json") + " --pp-stages-per-rank 2",
       "--pp-stages-per-rank needs --pp 2 or more"},
      {"--hf-config " + hf("llama2_7b.json") +
           " --pp 2 --gpus-per-node 2 --pp-schedule interleaved1f1b --pp-stages-per-rank 17",
       "--pp 2 x --pp-stages-per-rank 17 is 34 stages for the model's 32 blocks; allowed: at "
       "most 32"},
      {"--hf-config " + hf("llama2_7b.json") +
           " --pp 2 --gpus-per-node 2 --pp-schedule loopedbfs --pp-stages-per-rank 1e12",
       "is 2000000000000 stages for the model's 32 blocks"},
      {"--params 7e9 --attn-implementation flash",
       "--attn-implementation: 'flash' is not allowed; allowed: eager, sdpa, flash_attention_2"},
      {"--params 7e9 --batch 4", "--batch is a serving figure; give it with --inference"},
      {"--params 7e9 --inference --micro-batch 4",
       "--micro-batch is for training; with --inference give --batch (sequences per rank)"},
      {"--params 7e9 --inference --nvme-bw fast", "--nvme-bw: 'fast' is not a size"},
      {"--hf-config " + hf("llama2_7b.json") + " --sp 3 --gpus-per-node 4",
       "--sp 3 does not divide the 4 ranks (--nodes x --gpus-per-node); allowed: a divisor"},
      {"--hf-config " + hf("llama2_7b.json") + " --sp 2 --tp 2 --gpus-per-node 4",
       "--sp 2 with --tp 2 and --pp 1; allowed: sequence parallelism alone with ZeRO"},
      {"--hf-config " + hf("llama2_7b.json") + " --sp 2 --gpus-per-node 2 --seq 1025",
       "--sp 2: --seq 1025 does not split evenly over 2 ranks; allowed: a multiple of 2"},
      {"--hf-config " + hf("llama2_7b.json") +
           " --sp 2 --gpus-per-node 2 --attn-implementation "
           "eager",
       "--sp 2 with eager attention: Ulysses over transformers' attention takes sdpa"},
      {"--params 7e9 --sp 2 --gpus-per-node 2",
       "--sp 2 needs the model's shape to split its activations"},
      {"--hf-config " + hf("llama2_7b.json") + " --cp 2 --sp 2 --gpus-per-node 4",
       "--cp 2 with --sp 2; allowed: one of the two (--cp splits each sequence by torch's ring "
       "attention, --sp by Ulysses' exchanges)"},
      {"--hf-config " + hf("llama2_7b.json") + " --cp 2 --gpus-per-node 2 --seq 1026",
       "--cp 2: --seq 1026 does not split evenly over 2 ranks in 4 chunks (the ring's load "
       "balancing); allowed: a multiple of 4"},
      {"--hf-config " + hf("llama2_7b.json") +
           " --cp 2 --gpus-per-node 2 --attn-implementation eager",
       "--cp 2 with eager attention: torch's ring attention takes sdpa (eager needs the whole "
       "mask); allowed: --attn-implementation sdpa"},
      {"--hf-config " + hf("llama2_7b.json") + " --cp 2 --tp 2 --gpus-per-node 4",
       "--cp 2 with --tp 2 and --pp 1; allowed: context parallelism alone with ZeRO"},
      {"--hf-config " + hf("mixtral_8x7b.json") + " --tiled-mlp 4",
       "--tiled-mlp 4: the model's MLPs are a mixture of experts; allowed: a dense model"},
      {"--hf-config " + hf("llama2_7b.json") + " --tiled-logits 4 --inference",
       "--tiled-logits 4 with --inference; allowed: training without pipeline stages"},
      {"--params 7e9 --tiled-mlp 2", "--tiled-mlp 2 needs the model's shape to count activations"},
      {"--hf-config " + hf("llama2_7b.json") + " --tiled-logits 0",
       "--tiled-logits: '0' is not allowed; allowed: a positive integer"},
      {"--params 7e9 --max-seq", "--max-seq needs the model's shape to count activations"},
      {"--hf-config " + hf("llama2_7b.json") + " --inference --max-seq",
       "--max-seq with --inference; allowed: training without pipeline stages"},
      {"--params 7e9 --max-micro-batch",
       "--max-micro-batch needs the model's shape to count activations"},
  };
  for (const auto& [args, expected] : cases) {
    SCOPED_TRACE(args);
    const CliRun r = estimate(args);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find(expected), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
    EXPECT_TRUE(r.out.empty());
  }
}

TEST(EstimateCli, HelpExitsZero) {
  const CliRun r = estimate("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--hf-config"), std::string::npos);
}

TEST(EstimateCli, SaysWhenActivationsAreWhatDoesNotFit) {
  const std::string without_checkpointing =
      "--hf-config " + hf("llama2_7b.json") +
      " --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 512GB --nvme 2TB --seq 4096 --micro-batch 4";
  const CliRun r = estimate(without_checkpointing);
  EXPECT_EQ(r.code, 1) << r.err;
  // s*b = 16,384 tokens, bf16, sdpa: per token 186,496 bytes in each of 32 blocks (two
  // RMSNorms 2*8*4096, q, k, v, output 2*4*4096, log-sum-exp 4*32, gated MLP 4*2*11008)
  // and 224,768 in the head (final norm 8*4096, logits 6*32000): 94.49 GiB per rank.
  EXPECT_NE(r.out.find("activations are 94.49 GiB of it"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("with activation checkpointing"), std::string::npos) << r.out;
}

// Serving Llama-2-7b (6,738,415,616 parameters, 32 layers of 32 heads of 128, bf16) with
// 8 sequences of 2,048 tokens: the KV cache is 2 x 32 x 8 x 2,048 x 4,096 x 2 bytes = 8 GiB;
// with 24 GB of device and 8 GB of host only NVMe holds the weights. Each decoding step
// reads every weight and the KV cache from device memory (2p bytes + 8 GiB) and the rank's
// shard (2p plus each
// unit's padding, at most 64 elements a unit) from host RAM up to max_in_cpu and NVMe
// after, at 3.35 TB/s, 25 GB/s and 6 GB/s (the node's NVMe halved for two ranks a node).
TEST(EstimateCli, InferencePlansWhereTheWeightsRestAndTheTokensTheirReadsAllow) {
  const std::string model = "--hf-config " + hf("llama2_7b.json") + " --inference";
  const CliRun r = estimate(model +
                            " --gpu-mem 24GB --cpu-mem 8GB --nvme 1TB --seq 2048 "
                            "--batch 8 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["inference"]["kv_cache_bytes"].get<int64_t>(), int64_t{8} << 30);
  const int64_t p = 6'738'415'616;
  nlohmann::json chosen;
  for (const auto& o : j["options"]) {
    if (o["allowed"].get<bool>()) {
      EXPECT_EQ(o["stage"], 3) << o.dump();
      EXPECT_EQ(o["offload_optimizer"], o["offload_param"]) << o.dump();  // no optimizer rows
    }
    if (o["recommended"].get<bool>()) chosen = o;
  }
  ASSERT_FALSE(chosen.is_null()) << r.out;
  EXPECT_EQ(chosen["offload_param"], "nvme");
  const auto& st = chosen["stream"];
  const auto device = st["device_bytes_per_step"].get<double>();
  const auto host = st["host_bytes_per_step"].get<double>();
  const auto nvme = st["nvme_bytes_per_step"].get<double>();
  EXPECT_EQ(device, 2.0 * p + 8.0 * (1 << 30));
  EXPECT_GE(host + nvme, 2.0 * p);
  EXPECT_LE(host + nvme, 2.0 * (p + 64 * 35));  // 35 units
  EXPECT_GT(nvme, 0);
  const double seconds = device / 3.35e12 + host / 25e9 + nvme / 6e9;
  EXPECT_NEAR(st["seconds_per_step"].get<double>(), seconds, 1e-9 * seconds);
  EXPECT_NEAR(st["tokens_per_second_per_rank"].get<double>(), 8 / seconds, 1e-9 * 8 / seconds);
  EXPECT_EQ(st["bound_by"], "nvme");
  // Two ranks of 16 GB share the node's 10 GB of host RAM and its 12 GB/s of NVMe: 6 GB/s
  // each. (The table below: 80 GB of device memory holds the weights.)
  const CliRun two = estimate(model +
                              " --gpus-per-node 2 --gpu-mem 16GB --cpu-mem 10GB "
                              "--nvme 1TB --seq 2048 --batch 8 --nvme-bw 12GB --json");
  ASSERT_EQ(two.code, 0) << two.err;
  const auto two_plan = nlohmann::json::parse(two.out);  // alive through the loop
  for (const auto& o : two_plan["options"]) {
    if (!o["recommended"].get<bool>()) continue;
    EXPECT_EQ(o["offload_param"], "nvme");
    const auto& s2 = o["stream"];
    const double expected = s2["device_bytes_per_step"].get<double>() / 3.35e12 +
                            s2["host_bytes_per_step"].get<double>() / 25e9 +
                            s2["nvme_bytes_per_step"].get<double>() / 6e9;
    EXPECT_NEAR(s2["seconds_per_step"].get<double>(), expected, 1e-9 * expected);
  }
  // 16 sequences: a 16 GiB cache fits on 24 GB beside no placement of the weights; in host
  // RAM it leaves three layers' (3 x 0.5 GiB) on the device, and crosses the host link twice
  // a step beside the weights' shard there.
  const CliRun host_kv = estimate(model + " --gpu-mem 24GB --cpu-mem 512GB --seq 2048 --batch 16");
  ASSERT_EQ(host_kv.code, 0) << host_kv.err;
  EXPECT_NE(host_kv.out.find("* stage 3, weights cpu, KV cache host"), std::string::npos)
      << host_kv.out;
  EXPECT_NE(host_kv.out.find("activations             7.19     16.00"), std::string::npos)
      << host_kv.out;
  EXPECT_NE(host_kv.out.find("host RAM 44.55 GiB (the KV cache there and back"), std::string::npos)
      << host_kv.out;  // 2 x 16 GiB + the weights' 12.55
  EXPECT_NE(host_kv.out.find("generate(..., cache_implementation=\"offloaded\")"),
            std::string::npos)
      << host_kv.out;
  const CliRun table = estimate(model + " --gpu-mem 80GB --seq 2048 --batch 8");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("* stage 3, weights device"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("8.00 GiB per rank"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("tokens/s per rank"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("optimizer"), std::string::npos) << table.out;
}
