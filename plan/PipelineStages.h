#pragma once
// How pipeline parallelism divides a model and its activations among the stages, for the
// memory model: which blocks each stage holds, and how many micro-batches' activations a
// stage keeps at once under a schedule.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

// Schedules that run several stages on each rank (torch's ScheduleInterleaved1F1B and
// ScheduleLoopedBFS): "interleaved1f1b", "loopedbfs".
bool runs_several_stages(const std::string& schedule);

// The stages rank `rank` of `ranks` runs when each runs `per_rank`: r, r + ranks, ...
// (torch's placement for its interleaved schedules).
std::vector<int64_t> stages_of_rank(int64_t ranks, int64_t per_rank, int64_t rank);

// After one forward or backward of a rank's order under a schedule that runs several
// stages: for each of its stages (stages_of_rank's order), the micro-batches whose
// activations it holds, and those it has run forward this step.
struct PartsStep {
  std::vector<int64_t> held;
  std::vector<int64_t> forwarded;
};

// The rank's forwards and backwards of one step, in the order torch's schedule runs them:
// Interleaved1F1B warms up with (per_rank - 1) x (micro-batches per round) + 2 x
// (ranks - 1 - rank) forwards, then alternates one forward and one backward, then runs the
// rest backward; LoopedBFS runs every forward of its first stage, then of the next, then
// every backward from the last. An error names `what` for a schedule or micro-batch count
// it does not run (torch's Interleaved1F1B needs micro-batches a multiple of its rounds).
std::vector<PartsStep> parts_in_flight(const std::string& schedule, int64_t ranks, int64_t per_rank,
                                       int64_t rank, int64_t micro_batches,
                                       const std::string& what);

// The most micro-batches held at once over the rank's stages, along `steps`.
int64_t most_in_flight(const std::vector<PartsStep>& steps);

}  // namespace zeroshard
