#pragma once
// zeroshard-estimate's command line, turned into the Planner's inputs.
#include <map>
#include <string>
#include <vector>

#include "config/Config.h"
#include "plan/MemoryModel.h"
#include "plan/ModelSpec.h"
#include "plan/Planner.h"
#include "plan/ServingStream.h"

namespace zeroshard::estimate {

// One pipeline rank's share (--pp): its stages (one, or several under an interleaved
// schedule), their model, the micro-batches they hold at once.
struct StageInputs {
  std::vector<int64_t> held{0};
  ModelSpec spec;
  TrainingShape shape;
};

struct EstimateInputs {
  ModelSpec spec;  // the whole model; with --pp, also `stages`, each planned on its own
  Config config;
  WorldShape world;
  TrainingShape shape;
  HardwareBudget budget;
  // --pp: the stages (world and budget are then one stage's: its ranks, and the host and
  // NVMe a node shares among the stages on it), the schedule and its micro-batches.
  int64_t pipeline_stages = 1;
  int64_t stages_per_rank = 1;  // --pp-stages-per-rank: interleaved schedules' V
  std::string schedule;
  int64_t micro_batches = 1;
  std::vector<StageInputs> stages;
  // --inference: the model served, and each tier's bandwidth for the stream's bound.
  bool inference = false;
  Bandwidths bandwidths;
  bool json = false;
  bool max_seq = false;                  // --max-seq: the longest sequence each choice trains
  bool max_micro_batch = false;          // --max-micro-batch: the largest micro-batch likewise
  std::string emit_config;               // path, or empty
  std::vector<std::string> assumptions;  // what was not given and what we assumed
  std::vector<std::string> warnings;     // from loading the config
};

// Throws Error with a one-line message on bad input. `help` is set for --help.
EstimateInputs parse_args(const std::vector<std::string>& args, bool& help);

// Parts of parse_args. Flags as given: {"--seq": "4096", "--json": ""}.
using GivenFlags = std::map<std::string, std::string>;
// A count given to `flag`: a positive integer (with allow_zero, non-negative), else Error.
int64_t parse_count(const std::string& flag, const std::string& text, bool allow_zero = false);
// EstimateSequenceArgs.cpp: --sp or --cp (the config's sequence_parallel_size), and
// --tiled-mlp, --tiled-logits; after the model, the world and --pp are read.
void read_sequence_parallel(const GivenFlags& given, EstimateInputs& in);
void read_tiles(const GivenFlags& given, EstimateInputs& in);

const char* usage_text();

}  // namespace zeroshard::estimate
