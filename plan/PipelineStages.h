#pragma once
// How pipeline parallelism divides a model and its activations among the stages, for the
// memory model: which blocks each stage holds, and how many micro-batches' activations a
// stage keeps at once under a schedule.
#include <cstdint>
#include <string>
#include <utility>

namespace zeroshard {

// (first block, block count) of `stage` when `layers` blocks are split over `stages`:
// equal shares, the first stages taking one more where they do not divide (DeepSpeed's
// partition_method "uniform", and torchtitan's default split).
std::pair<int64_t, int64_t> stage_blocks(int64_t layers, int64_t stages, int64_t stage);

// Micro-batches whose activations `stage` holds at its peak: GPipe runs every forward
// before any backward (all `micro_batches`); 1F1B starts backward as soon as the last stage
// can, so stage s holds at most stages - s. `schedule`: "gpipe" or "1f1b"; an error names
// `what` and the allowed names for any other.
int64_t micro_batches_in_flight(const std::string& schedule, int64_t stages, int64_t stage,
                                int64_t micro_batches, const std::string& what);

}  // namespace zeroshard
