#include "plan/LongestSequence.h"

#include <algorithm>
#include <map>

namespace zeroshard {

std::vector<int64_t> longest_sequences(const ModelSpec& spec, const Config& config,
                                       const WorldShape& world, const TrainingShape& shape,
                                       const HardwareBudget& budget) {
  const int64_t step = std::max<int64_t>(1, config.sequence_parallel_size.value_or(1));
  const std::vector<PlanOption>& options = plan_options();
  // Whether each option fits at `steps` x step tokens: one plan judges every option.
  std::map<int64_t, std::vector<bool>> judged;
  const auto fits = [&](int64_t steps, size_t option) {
    auto it = judged.find(steps);
    if (it == judged.end()) {
      TrainingShape at = shape;
      at.seq = steps * step;
      const Plan plan = make_plan(spec, config, world, at, budget);
      std::vector<bool> each(options.size(), false);
      for (const OptionEstimate& e : plan.options) {
        const auto where = std::find(options.begin(), options.end(), e.option);
        if (where != options.end()) each[where - options.begin()] = e.fits && e.allowed;
      }
      it = judged.emplace(steps, std::move(each)).first;
    }
    return it->second[option];
  };
  std::vector<int64_t> longest(options.size(), 0);
  for (size_t o = 0; o < options.size(); ++o) {
    // Activations grow with the sequence: the fitting lengths are a prefix.
    int64_t low = 0, high = kLongestSequenceSearched / step;
    while (low < high) {
      const int64_t mid = low + (high - low + 1) / 2;
      if (fits(mid, o)) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    longest[o] = low * step;
  }
  return longest;
}

}  // namespace zeroshard
