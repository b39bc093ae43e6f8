#pragma once
// Adam/AdamW hyperparameters, shared by sharding/ (OptimizerShard) and offload/
// (CpuAdam). Doubles, as torch forms its scalars: each coefficient is computed in
// double and rounded once.
namespace zeroshard {

struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  // AdamW; false: Adam with L2 added to the gradient
};

}  // namespace zeroshard
