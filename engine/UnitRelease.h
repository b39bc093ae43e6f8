#pragma once
// When a stage-3 unit's gathered parameters may go in backward.
//
// A unit's trainable parameters are done once each has its gradient: the autograd node
// that read a parameter is the one that produced its gradient. Its frozen parameters
// are read for one thing only, the gradient of what flows into them, and a frozen one
// near the unit's start (the LayerNorm before attention, a LoRA layer's base weight) is
// read after every trainable gradient of the unit is in. So a unit with frozen
// parameters goes when both are done: its trainable gradients (if it has any) and the
// gradients of its inputs (if any needs one). The Python package reports the inputs
// (tensor hooks); a LibTorch unit's inputs are unknown, and such a unit goes at the end
// of backward. A unit without frozen parameters goes with its gradients, as before.
#include <cstddef>
#include <vector>

#include "engine/GroupTable.h"

namespace zeroshard {

class UnitRelease {
 public:
  // Per unit: how many trainable groups it holds (two with experts apart: engine/
  // GroupLayout.h), and whether it holds frozen ones.
  void init(const GroupTable& groups);

  // A forward of `unit` whose inputs need gradients. `recomputed`: inside backward
  // (activation checkpointing), where a count left by the unit's first forward stands.
  // True when counted: the caller then reports the inputs' gradients with inputs_done.
  bool inputs_need_grad(UnitId unit, bool recomputed);
  // A forward with unknown inputs (LibTorch's run_unit) whose output needs gradients.
  void inputs_unknown(UnitId unit);

  // Each returns whether the unit may go now. grads_done: one of its trainable groups has
  // every gradient (once per group and backward); the unit's are done with the last.
  bool inputs_done(UnitId unit);
  bool grads_done(UnitId unit);

  // At the end of each backward: every unit gone, nothing pending.
  void reset();

 private:
  bool may_go(size_t unit) const;

  std::vector<int> trainable_, grads_pending_;  // per unit: trainable groups, those not done
  std::vector<char> frozen_;
  std::vector<int> inputs_pending_;  // forwards whose inputs' gradients are still due
};

}  // namespace zeroshard
