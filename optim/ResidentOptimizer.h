#pragma once
// ResidentOptimizer: AdamW (or Adam with L2 decay) over this rank's shard, its state
// (fp32 master weights, m and v) resident where the parameters are.
// With fp32 compute the master is the parameter shard itself; with bf16/fp16 it is a
// separate fp32 copy, written back to the compute-precision shard after each step.
// The arithmetic follows torch.optim.AdamW step by step so results match it.
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/AdamHyper.h"
#include "common/MemoryLedger.h"
#include "optim/ShardOptimizer.h"

namespace zeroshard {

// One step's arithmetic over fp32 master, grad (scaled by grad_scale first), m and v.
// The default is ATen operations, one per term, as torch.optim.AdamW's for-loop
// implementation; engine/ hands in a faster one: CpuAdam on the host, fused_adam_kernel()
// on a GPU.
using AdamKernel =
    std::function<void(const AdamHyper& h, int64_t step, double grad_scale, at::Tensor& master,
                       at::Tensor& grad, at::Tensor& m, at::Tensor& v)>;

// torch's fused AdamW (or Adam with L2 decay) kernel, what torch.optim.AdamW(fused=True)
// runs: one pass over master, grad, m and v where the ATen operations make about nine,
// with temporaries. The gradient's scale goes in as the kernel's divisor (1/grad_scale),
// and the kernel leaves the gradient divided by it.
AdamKernel fused_adam_kernel();

class ResidentOptimizer : public ShardOptimizer {
 public:
  explicit ResidentOptimizer(MemoryLedger* ledger, AdamKernel kernel = {})
      : ledger_(ledger), kernel_(std::move(kernel)) {}

  void add_group(const at::Tensor& shard, std::vector<HyperSpan> spans = {}) override;
  using ShardOptimizer::step;
  void step(const std::vector<at::Tensor>& grads, double grad_scale,
            const std::vector<AdamHyper>& hypers) override;
  int64_t steps() const override { return steps_; }
  size_t groups() const override { return states_.size(); }
  void reload_master(size_t group) override;
  int64_t group_numel(size_t group) const override { return states_.at(group).m.numel(); }
  std::vector<std::string> state_names() const override { return adam_state_names(); }
  void read_state(size_t group, const std::vector<float*>& arrays) override;
  void write_state(size_t group, const std::vector<std::string>& names,
                   const std::vector<const float*>& arrays) override;
  // The same, Adam's arrays by name.
  void read_state(size_t group, float* master, float* m, float* v);
  void write_state(size_t group, const float* master, const float* m, const float* v);
  void set_steps(int64_t steps) override { steps_ = steps; }

  struct State {
    at::Tensor shard, master, m, v;
    std::vector<HyperSpan> spans;
  };
  const std::vector<State>& states() const { return states_; }

 private:
  static void aten_step(const AdamHyper& h, int64_t step, double grad_scale, at::Tensor master,
                        at::Tensor g, at::Tensor m, at::Tensor v);
  MemoryLedger* ledger_;
  AdamKernel kernel_;
  std::vector<State> states_;
  std::vector<LedgerEntry> entries_;
  int64_t steps_ = 0;
};

}  // namespace zeroshard
