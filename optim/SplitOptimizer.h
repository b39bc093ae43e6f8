#pragma once
// Two optimizers over one rank's shards, each stepping its own groups: offload_optimizer
// .ratio below 1, where the first groups keep their Adam state on the GPU
// (ResidentOptimizer) and the rest step on the host (optim/OffloadOptimizer.h), as
// DeepSpeed's ZeRO-Offload++ splits its sub-groups. plan/OptimizerSplit.h decides which
// group goes where; the engine and the checkpoints see one optimizer numbering every group
// in the order it was added.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/ShardOptimizer.h"

namespace zeroshard {

class SplitOptimizer : public ShardOptimizer {
 public:
  // `on_host[i]`: the i-th group added goes to `host`, else to `device`. Both keep the
  // same per-element state (Adam's).
  SplitOptimizer(std::unique_ptr<ShardOptimizer> device, std::unique_ptr<ShardOptimizer> host,
                 std::vector<bool> on_host);

  void add_group(const at::Tensor& shard, std::vector<HyperSpan> spans = {}) override;
  void add_param_pieces(size_t group, std::vector<ParamPiece> pieces, size_t params) override;
  using ShardOptimizer::step;
  // The device's groups first: their kernels are queued, and run while the host steps.
  void step(const std::vector<at::Tensor>& grads, double grad_scale,
            const std::vector<AdamHyper>& hypers) override;
  int64_t steps() const override { return device_->steps(); }
  size_t groups() const override { return where_.size(); }
  void reload_master(size_t group) override;
  int64_t group_numel(size_t group) const override;
  std::vector<std::string> state_names() const override { return host_->state_names(); }
  void read_state(size_t group, const std::vector<float*>& arrays) override;
  void write_state(size_t group, const std::vector<std::string>& names,
                   const std::vector<const float*>& arrays) override;
  void set_steps(int64_t steps) override;
  void start() override;

 private:
  struct Place {
    ShardOptimizer* optimizer;
    size_t group;  // its own numbering
  };
  const Place& place(size_t group) const;

  std::unique_ptr<ShardOptimizer> device_, host_;
  std::vector<bool> on_host_;
  std::vector<Place> where_;  // per group added
};

}  // namespace zeroshard
