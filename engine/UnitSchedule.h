#pragma once
// Stage 3's units through a step: the model's calls for a unit (its forward, its
// backward, a read outside training) turned into the coordinator's gathers and releases
// of that unit's groups, and the moment each unit may go in backward (engine/UnitRelease.h).
//
// A unit here is the user's (a module run_unit is given, or an nn.Module whose hooks the
// Python package installs), indexed by UnitId. It holds one or more coordinator units (a
// flat group per dtype, or for its frozen parameters), which the coordinator indexes
// (engine/GroupTable.h keeps both). Below stage 3 there is no schedule: the engine only
// checks that a unit it is told about exists.
#include <memory>
#include <vector>

#include "engine/GroupTable.h"
#include "engine/UnitRelease.h"

namespace zeroshard {

class ParamCoordinator;
class ParamHome;

class UnitSchedule {
 public:
  // `groups` outlives the schedule; the coordinator is the schedule's from here on, and
  // so is `home`, where the coordinator finds shards kept on NVMe (null: none are).
  UnitSchedule(const GroupTable& groups, std::unique_ptr<ParamCoordinator> coordinator,
               std::unique_ptr<ParamHome> home = nullptr);
  ~UnitSchedule();
  UnitSchedule(const UnitSchedule&) = delete;
  UnitSchedule& operator=(const UnitSchedule&) = delete;

  // For what addresses coordinator units directly (checkpoints, whole-model reads).
  ParamCoordinator& coordinator() { return *coordinator_; }
  const ParamCoordinator& coordinator() const { return *coordinator_; }
  ParamHome* home() const { return home_.get(); }

  // A unit's forward and the start of its backward (run_unit, Python's module hooks).
  void forward_begin(UnitId unit);
  void forward_end(UnitId unit);
  void backward_begin(UnitId unit);
  // A forward whose inputs need gradients: true when the caller must report them with
  // inputs_done (engine/UnitRelease.h says why frozen parameters wait for them).
  bool inputs_need_grad(UnitId unit);
  void inputs_done(UnitId unit);
  // A forward with inputs the engine cannot see (LibTorch's run_unit).
  void inputs_unknown(UnitId unit);
  // Every gradient of the unit's trainable parameters is in (the reducer's callback).
  void grads_done(UnitId unit);

  // The whole model's forward, then backward's start and end.
  void model_forward_begin();
  void model_forward_end(bool grad_enabled);
  void end_forward();
  void end_backward();

  // Outside forward and backward: a read of the unit's parameters (Python's touch), what
  // the unit holds (ParamCoordinator::Held, the least of its groups'), and an explicit
  // gather and release.
  int touch(UnitId unit, bool grad_enabled);
  int held(UnitId unit) const;
  void gather(UnitId unit);
  void release(UnitId unit);

 private:
  void release_in_backward(UnitId unit);

  const GroupTable& groups_;
  std::unique_ptr<ParamHome> home_;  // before the coordinator, which reads it
  std::unique_ptr<ParamCoordinator> coordinator_;
  UnitRelease release_;
};

}  // namespace zeroshard
