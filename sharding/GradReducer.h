#pragma once
// Turns each rank's gradients into what its optimizer shard needs: the sum over ranks
// (and over accumulated micro-batches) in fp32.
//   stage 0: all-reduce of the whole buffer; the optimizer sees every element.
//   stage 1: gradients accumulate locally across micro-batches; at the boundary one
//            reduce-scatter per group gives this rank its shard (half an all-reduce).
//   stage 2/3: every backward reduce-scatters into an fp32 shard accumulator and the
//            full gradient buffer is released until the next backward.
// Groups are reduced in their fixed order on every rank, whatever the data did.
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"
#include "sharding/Collectives.h"
#include "sharding/FlatParamGroup.h"

namespace zeroshard {

class GradReducer {
 public:
  GradReducer(std::vector<FlatParamGroup*> groups, int stage, Collectives* comm,
              MemoryLedger* ledger);

  void before_backward();
  void after_backward();
  // At the accumulation boundary: per group, the fp32 gradient summed over ranks and
  // micro-batches (the full buffer at stage 0, this rank's shard otherwise).
  const std::vector<at::Tensor>& reduce_for_step();
  // Global L2 norm of `grads` x `scale` across all ranks.
  double global_norm(double scale);
  // Whether any rank's gradients hold inf or NaN (fp16 overflow).
  bool any_overflow();
  void zero();

 private:
  bool sharded_grads() const { return stage_ >= 1; }
  std::vector<FlatParamGroup*> groups_;
  int stage_;
  Collectives* comm_;
  std::vector<at::Tensor> fp32_;  // what reduce_for_step returns
  std::vector<LedgerEntry> fp32_entries_;
};

}  // namespace zeroshard
