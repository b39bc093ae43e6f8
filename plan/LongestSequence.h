#pragma once
// The longest sequence (zeroshard-estimate --max-seq) and the largest micro-batch
// (--max-micro-batch) each stage/offload choice trains within the budget: the memory model
// asked at growing sizes, every other setting as given.
#include <cstdint>
#include <vector>

#include "plan/Planner.h"

namespace zeroshard {

// Sequences are searched up to this many tokens (ALST trained 15M on 32 GPUs), micro-batches
// up to this many sequences.
constexpr int64_t kLongestSequenceSearched = int64_t{1} << 24;
constexpr int64_t kLargestMicroBatchSearched = int64_t{1} << 16;

// One option's largest size that fits (0: not even the smallest) and, with
// activation_checkpointing.mode auto, the blocks it recomputes whole at that size.
struct Fitting {
  int64_t size = 0;
  int64_t recomputed = 0;
};

// Per option of plan_options(), in its order: the longest sequence, a multiple of the
// sequence-parallel size (the config's sequence_parallel_size, which splits it), with which
// the option fits `budget` (0: not even that size). `shape`'s micro-batch and
// checkpointing hold; its seq is ignored.
std::vector<Fitting> longest_sequences(const ModelSpec& spec, const Config& config,
                                       const WorldShape& world, const TrainingShape& shape,
                                       const HardwareBudget& budget);

// Per option of plan_options(), in its order: the largest micro-batch with which the option
// fits `budget` at `shape`'s sequence length (0: not even one sequence).
std::vector<Fitting> largest_micro_batches(const ModelSpec& spec, const Config& config,
                                           const WorldShape& world, const TrainingShape& shape,
                                           const HardwareBudget& budget);

}  // namespace zeroshard
