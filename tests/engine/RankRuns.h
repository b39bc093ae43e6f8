#pragma once
// Runs a Scenario on N real rank processes (engine_worker) and reads back what each
// rank wrote: final parameters, per-step statistics and its MemoryLedger.
#include <vector>

#include <ATen/core/Tensor.h>

#include "tests/engine/TestModels.h"

namespace zeroshard::testing {

struct RankOutput {
  std::vector<at::Tensor> params;
  at::Tensor buffers;  // every module buffer, flattened, in registration order
  at::Tensor stats;    // steps x (stepped, loss scale, grad norm, loss)
  at::Tensor memory;   // kinds x (current, predicted, peak), device tier
};

// Empty (and a test failure recorded) when any rank failed.
std::vector<RankOutput> run_ranks(const Scenario& s, int world);

}  // namespace zeroshard::testing
