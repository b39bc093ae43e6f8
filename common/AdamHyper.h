#pragma once
// Adam/AdamW hyperparameters, shared by sharding/ (ResidentOptimizer) and offload/
// (CpuAdam). Doubles, as torch forms its scalars: each coefficient is computed in
// double and rounded once.
//
// A shard may hold parameters of several optimizer parameter groups (torch's
// param_groups: a transformer block's weights decay, its biases and norms do not), so
// an optimizer steps a shard span by span, each span with its group's hyperparameters.
#include <cstdint>
#include <vector>

#include "common/Error.h"

namespace zeroshard {

struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  // AdamW; false: Adam with L2 added to the gradient
  // false: the moments are used as they are, step size lr (DeepSpeed's
  // bias_correction: false); true: divided by 1 - beta^t, as torch's Adam does.
  bool bias_correction = true;
};

// Elements [begin, begin + count) of a shard (its own coordinates) belong to parameter
// group `group`. A shard's spans cover it in order; none means one group, index 0.
struct HyperSpan {
  int64_t begin = 0;
  int64_t count = 0;
  size_t group = 0;
};

// Calls fn(begin, count, hyper) for each piece of [begin, begin + count) (shard
// coordinates) that lies in one span, with that span's group's hyperparameters.
template <class Fn>
void for_each_span(const std::vector<HyperSpan>& spans, const std::vector<AdamHyper>& hypers,
                   int64_t begin, int64_t count, Fn&& fn) {
  if (hypers.empty()) fail("the optimizer was stepped without hyperparameters");
  if (spans.empty()) {
    if (count > 0) fn(begin, count, hypers[0]);
    return;
  }
  const int64_t end = begin + count;
  for (const HyperSpan& s : spans) {
    const int64_t b = s.begin > begin ? s.begin : begin;
    const int64_t e = s.begin + s.count < end ? s.begin + s.count : end;
    if (b >= e) continue;
    if (s.group >= hypers.size())
      fail("parameter group {} stepped with hyperparameters for {} groups", s.group, hypers.size());
    fn(b, e - b, hypers[s.group]);
  }
}

}  // namespace zeroshard
