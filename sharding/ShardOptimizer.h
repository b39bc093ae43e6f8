#pragma once
// The optimizer over this rank's shards, as the engine steps it: groups added once, a
// step over every group's reduced gradient, and each group's state read and written
// whole for checkpoints.
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/AdamHyper.h"

namespace zeroshard {

// What the Engine steps: ResidentOptimizer (sharding/ResidentOptimizer.h: state where the
// parameters are) or engine/'s OffloadOptimizer (state in host RAM or on NVMe).
class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  // `shard` is this rank's compute-precision parameter shard (a view it writes back to);
  // `spans`: which parameter group each of its elements belongs to (none: group 0).
  virtual void add_group(const at::Tensor& shard, std::vector<HyperSpan> spans = {}) = 0;
  // grads[i] (fp32, same size as group i) are multiplied by `grad_scale` first;
  // hypers[g] are parameter group g's hyperparameters.
  virtual void step(const std::vector<at::Tensor>& grads, double grad_scale,
                    const std::vector<AdamHyper>& hypers) = 0;
  // One parameter group.
  void step(const std::vector<at::Tensor>& grads, double grad_scale, const AdamHyper& h) {
    step(grads, grad_scale, std::vector<AdamHyper>{h});
  }
  virtual int64_t steps() const = 0;
  virtual size_t groups() const = 0;
  // The parameters of `group` were overwritten (outside training): the fp32 master
  // restarts from its shard; Adam's moments are kept.
  virtual void reload_master(size_t group) = 0;
  // Checkpoints, one whole group at a time: its fp32 master, m and v (numel each);
  // write_state also sets the compute-precision shard from the master.
  virtual int64_t group_numel(size_t group) const = 0;
  virtual void read_state(size_t group, float* master, float* m, float* v) = 0;
  virtual void write_state(size_t group, const float* master, const float* m, const float* v) = 0;
  virtual void set_steps(int64_t steps) = 0;
};

}  // namespace zeroshard
