#include <fmt/format.h>

#include "common/Error.h"
#include "tools/estimate/EstimateArgs.h"

namespace zeroshard::estimate {

// --sp (or the config's sequence_parallel_size), checked as the engine and ALST's path
// check it: ranks and heads split evenly, ZeRO alone beside it, attention without scores.
// --cp: the ranks split each sequence by torch's ring attention instead (a mesh's cp
// dimension), counted as sequence-parallel ranks are; its load balancing cuts 2 x N chunks.
void read_sequence_parallel(const GivenFlags& given, EstimateInputs& in) {
  const int64_t configured = in.config.sequence_parallel_size.value_or(1);
  const bool ring = given.count("--cp") > 0;
  if (ring && (given.count("--sp") || configured > 1))
    fail(
        "--cp {} with {}; allowed: one of the two (--cp splits each sequence by torch's ring "
        "attention, --sp by Ulysses' exchanges)",
        given.at("--cp"),
        given.count("--sp") ? "--sp " + given.at("--sp")
                            : fmt::format("the config's sequence_parallel_size {}", configured));
  const char* flag = ring ? "--cp" : "--sp";
  const int64_t sp = ring                  ? parse_count("--cp", given.at("--cp"))
                     : given.count("--sp") ? parse_count("--sp", given.at("--sp"))
                                           : configured;
  if (configured > 1 && sp != configured)
    fail("--sp {} contradicts the config's sequence_parallel_size {}; give one of them", sp,
         configured);
  in.config.sequence_parallel_size = sp;
  in.config.ring_attention = ring && sp > 1;
  if (sp == 1) return;
  const int64_t ranks = in.world.ranks() * in.pipeline_stages;
  if (in.world.tensor_parallel > 1 || in.pipeline_stages > 1)
    fail("{} {} with --tp {} and --pp {}; allowed: {} alone with ZeRO (--tp 1, --pp 1), or {} 1",
         flag, sp, in.world.tensor_parallel, in.pipeline_stages,
         ring ? "context parallelism" : "sequence parallelism", flag);
  if (in.inference)
    fail("{} {} with --inference; allowed: {} 1 (serving plans one rank)", flag, sp, flag);
  if (ranks % sp != 0)
    fail("{} {} does not divide the {} ranks (--nodes x --gpus-per-node); allowed: a divisor", flag,
         sp, ranks);
  if (!in.spec.has_shape())
    fail(
        "{} {} needs the model's shape to split its activations: give --hf-config, or "
        "--layers, --hidden and --heads",
        flag, sp);
  if (!ring && in.spec.heads % sp != 0)
    fail(
        "--sp {}: the model's {} attention heads do not split evenly over {} ranks; allowed: "
        "a divisor of {}",
        sp, in.spec.heads, sp, in.spec.heads);
  const int64_t chunks = ring ? 2 * sp : sp;  // the ring's head-tail load balancing
  if (in.shape.seq % chunks != 0)
    fail("{} {}: --seq {} does not split evenly over {} ranks{}; allowed: a multiple of {}", flag,
         sp, in.shape.seq, sp,
         ring ? fmt::format(" in {} chunks (the ring's load balancing)", chunks) : "", chunks);
  if (in.spec.attention_scores)
    fail(
        "{} {} with eager attention: {} takes sdpa{} (eager needs the whole mask); allowed: "
        "--attn-implementation sdpa{}",
        flag, sp, ring ? "torch's ring attention" : "Ulysses over transformers' attention",
        ring ? "" : " or flash attention", ring ? "" : ", flash_attention_2 or flash_attention_3");
}

// --tiled-mlp N, --tiled-logits N: ALST's TiledMLP and TiledFusedLogitsLoss
// (zeroshard.runtime.sequence_parallel.ulysses_sp), each with that many tiles of the rank's
// tokens: their activations as they keep them (plan/MemoryModel.h TrainingShape).
void read_tiles(const GivenFlags& given, EstimateInputs& in) {
  auto tiles = [&](const char* flag) -> int64_t {
    if (!given.count(flag)) return 0;
    const int64_t n = parse_count(flag, given.at(flag));
    if (in.inference || in.pipeline_stages > 1)
      fail("{} {} with {}; allowed: training without pipeline stages", flag, n,
           in.inference ? "--inference" : fmt::format("--pp {}", in.pipeline_stages));
    if (!in.spec.has_shape())
      fail(
          "{} {} needs the model's shape to count activations: give --hf-config, or --layers, "
          "--hidden and --heads",
          flag, n);
    return n;
  };
  in.shape.mlp_tiles = tiles("--tiled-mlp");
  if (in.shape.mlp_tiles > 0 && in.spec.experts_per_token > 0)
    fail(
        "--tiled-mlp {}: the model's MLPs are a mixture of experts; allowed: a dense model "
        "(TiledMLP tiles one MLP's tokens)",
        in.shape.mlp_tiles);
  in.shape.logits_tiles = tiles("--tiled-logits");
  if (in.shape.logits_tiles > 0 && (!in.spec.has_head || in.spec.vocab <= 0))
    fail(
        "--tiled-logits {}: the model makes no logits (no vocabulary); allowed: a model with a "
        "head",
        in.shape.logits_tiles);
}

}  // namespace zeroshard::estimate
