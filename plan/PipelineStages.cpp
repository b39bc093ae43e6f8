#include "plan/PipelineStages.h"

#include <algorithm>

#include "common/Error.h"

namespace zeroshard {

std::pair<int64_t, int64_t> stage_blocks(int64_t layers, int64_t stages, int64_t stage) {
  if (stages <= 1) return {0, layers};
  const int64_t share = layers / stages, extra = layers % stages;
  const int64_t first = stage * share + std::min(stage, extra);
  return {first, share + (stage < extra ? 1 : 0)};
}

int64_t micro_batches_in_flight(const std::string& schedule, int64_t stages, int64_t stage,
                                int64_t micro_batches, const std::string& what) {
  if (schedule == "gpipe") return micro_batches;
  if (schedule == "1f1b") return std::min(micro_batches, stages - stage);
  fail("{}: '{}' is not allowed; allowed: 1f1b or gpipe", what, schedule);
}

}  // namespace zeroshard
