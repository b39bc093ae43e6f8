#include "plan/LongestSequence.h"

#include <algorithm>
#include <map>

namespace zeroshard {

namespace {

// Per option, the largest n in [0, limit] with which it fits once grow(shape, n) has set the
// shape (activations grow with n: the fitting sizes are a prefix); one plan judges every
// option at each n.
template <typename Grow>
std::vector<Fitting> largest_fitting(const ModelSpec& spec, const Config& config,
                                     const WorldShape& world, const TrainingShape& shape,
                                     const HardwareBudget& budget, int64_t limit, Grow grow) {
  const std::vector<PlanOption>& options = plan_options();
  // Per n, per option: whether it fits (0: no), else 1 + the blocks it recomputes.
  std::map<int64_t, std::vector<int64_t>> judged;
  const auto judge = [&](int64_t n, size_t option) {
    auto it = judged.find(n);
    if (it == judged.end()) {
      TrainingShape at = shape;
      grow(at, n);
      const Plan plan = make_plan(spec, config, world, at, budget);
      std::vector<int64_t> each(options.size(), 0);
      for (const OptionEstimate& e : plan.options) {
        const auto where = std::find(options.begin(), options.end(), e.option);
        if (where != options.end() && e.fits && e.allowed)
          each[where - options.begin()] = 1 + e.recomputed.value_or(0);
      }
      it = judged.emplace(n, std::move(each)).first;
    }
    return it->second[option];
  };
  std::vector<Fitting> largest(options.size());
  for (size_t o = 0; o < options.size(); ++o) {
    int64_t low = 0, high = limit;
    while (low < high) {
      const int64_t mid = low + (high - low + 1) / 2;
      if (judge(mid, o) > 0) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    largest[o] = {low, low > 0 ? judge(low, o) - 1 : 0};
  }
  return largest;
}

}  // namespace

std::vector<Fitting> longest_sequences(const ModelSpec& spec, const Config& config,
                                       const WorldShape& world, const TrainingShape& shape,
                                       const HardwareBudget& budget) {
  // Whole slices: ranks x 2 under torch's ring attention (its head-tail load balancing).
  const int64_t step = std::max<int64_t>(1, config.sequence_parallel_size.value_or(1)) *
                       (config.ring_attention ? 2 : 1);
  std::vector<Fitting> steps =
      largest_fitting(spec, config, world, shape, budget, kLongestSequenceSearched / step,
                      [step](TrainingShape& at, int64_t n) { at.seq = n * step; });
  for (Fitting& f : steps) f.size *= step;
  return steps;
}

std::vector<Fitting> largest_micro_batches(const ModelSpec& spec, const Config& config,
                                           const WorldShape& world, const TrainingShape& shape,
                                           const HardwareBudget& budget) {
  return largest_fitting(spec, config, world, shape, budget, kLargestMicroBatchSearched,
                         [](TrainingShape& at, int64_t n) { at.micro_batch = n; });
}

}  // namespace zeroshard
