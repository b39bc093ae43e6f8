#pragma once
// The optimizer with its state off the device (ZeRO-Offload / ZeRO-Infinity): fp32
// master weights, Adam m and v in host RAM (device cpu) or on NVMe (device nvme),
// stepped by CpuAdam on the host, the updated parameters written back to the
// compute-precision shard. On NVMe each group's shard is cut into sub-groups of at
// most sub_group_size elements, each a swap region [master | m | v] that the Swapper
// streams through the pinned buffers: read ahead, Adam, write behind.
// Shards on a GPU get their updated values back through page-locked staging and a copy
// stream (optim/ShardUploads.h), while CPU Adam goes on with the next part;
// order_uploads_before_current() then orders them before what the compute stream runs next.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/MemoryLedger.h"
#include "config/Config.h"
#include "optim/ShardOptimizer.h"
#include "optim/ShardUploads.h"

namespace zeroshard {

class IoEngine;
class PinnedPool;
class Swapper;
struct SwapPassTimes;

struct OffloadOptimizerOptions {
  OffloadDevice device = OffloadDevice::Cpu;
  int64_t sub_group_numel = 100'000'000;
  int64_t buffer_count = 4;
  IoEngine* io = nullptr;  // nvme
  std::string swap_dir;    // nvme: this rank's swap directory
  bool page_lock = false;  // the model is on a GPU: page-lock the swap buffers
  // Sum the squared gradients in Adam's pass (grad_sum_squares()): the reported norm
  // when nothing clips; with clipping the norm is taken before the step, so not.
  bool sum_grad_squares = true;
};

class OffloadOptimizer : public ShardOptimizer {
 public:
  OffloadOptimizer(const OffloadOptimizerOptions& options, MemoryLedger* ledger);
  ~OffloadOptimizer() override;

  void add_group(const at::Tensor& shard, std::vector<HyperSpan> spans = {}) override;
  using ShardOptimizer::step;
  void step(const std::vector<at::Tensor>& grads, double grad_scale,
            const std::vector<AdamHyper>& hypers) override;
  int64_t steps() const override { return steps_; }
  size_t groups() const override { return shards_.size(); }
  void reload_master(size_t group) override;
  int64_t group_numel(size_t group) const override { return shards_.at(group).numel(); }
  std::vector<std::string> state_names() const override { return adam_state_names(); }
  void read_state(size_t group, const std::vector<float*>& arrays) override;
  void write_state(size_t group, const std::vector<std::string>& names,
                   const std::vector<const float*>& arrays) override;
  // The same, Adam's arrays by name.
  void read_state(size_t group, float* master, float* m, float* v);
  void write_state(size_t group, const float* master, const float* m, const float* v);
  void set_steps(int64_t steps) override { steps_ = steps; }
  // The same step one group at a time, as each gradient shard is ready (overlap_step):
  // begin_step() counts the step once, then step_group() for every group in any order.
  // The arithmetic is step()'s, so the result is the same.
  void begin_step() {
    ++steps_;
    grad_squares_.assign(shards_.size(), 0.0);
  }
  void step_group(size_t group, const at::Tensor& grad, double grad_scale,
                  const std::vector<AdamHyper>& hypers);
  // The last step's gradients, squared and summed (as they came, before the step's
  // scale), read by CPU Adam in its own pass over them: this rank's share of the gradient
  // norm with no pass of its own. Summed per group, then in group order: the same sum
  // whichever order the groups were stepped in.
  double grad_sum_squares() const;
  // Shards on a GPU: the calling thread's current stream waits (on the device) for every
  // updated shard's copy; step() does it itself, the overlapped step once it is finished.
  void order_uploads_before_current();
  // After the last add_group: writes the initial state to NVMe (else the first step does)
  // and, for shards on a GPU, allocates the staging of their way back.
  void start() override;
  // Called before a group's first update and after its last (parameter offload brings
  // the shard's storage back and writes it out).
  void on_group(std::function<void(size_t)> begin, std::function<void(size_t)> end) {
    hooks_.begin = std::move(begin);
    hooks_.end = std::move(end);
  }
  // nvme: where the last pass over the swap file spent its time (zeros before one).
  SwapPassTimes last_swap_pass() const;
  // nvme: reads every sub-group and writes it back unchanged through the step's own
  // buffers, swap file and I/O engine: a step's I/O without Adam, the reference that
  // zs bench swap holds the step to (other buffers or files are not the same I/O).
  void io_pass();

 private:
  struct SubGroup {
    size_t group;
    int64_t offset, numel;
  };
  struct HostState {  // cpu: a group's Adam state
    at::Tensor master, m, v;
  };
  struct NvmeState {  // the state's swap regions, their swap file and their pinned buffers
    std::vector<SubGroup> sub_groups;
    std::unique_ptr<Swapper> swapper;
    std::unique_ptr<PinnedPool> pool;
  };
  struct GroupHooks {  // on_group()'s
    std::function<void(size_t)> begin, end;
  };
  std::vector<size_t> sub_groups_of(size_t group) const;
  std::vector<size_t> all_sub_groups() const;  // nvme: every swap region, in order
  void open_swap();  // nvme: lays out every sub-group and writes the initial state
  // Where CPU Adam writes the updated bf16 parameters of [first, first + count), if it
  // does: the shard itself (host) or `staging` (a device shard's way back).
  uint16_t* fused_bf16(size_t group, int64_t first, const at::Tensor& staging);
  at::Tensor upload_staging(size_t group, int64_t count);  // undefined: a host shard
  int64_t largest_part_bytes() const;  // the most one upload carries: a shard or a sub-group
  void write_back(size_t group, int64_t first, int64_t count, const float* master,
                  const uint16_t* bf16, const at::Tensor& staging);
  void wait_uploads();  // the host waits until no upload is in flight
  // Adam over `count` elements of `group` from element `first`, whose master, m and v
  // start at the given pointers; `grad` is the group's whole fp32 gradient.
  struct Update {
    const float* grad;
    double grad_scale;
    const std::vector<AdamHyper>* hypers;
  };
  void adam(size_t group, const Update& u, int64_t first, int64_t count, float* master, float* m,
            float* v);
  void adam_sub_group(size_t r, const Update& u, void* buffer);  // nvme: one swap region

  OffloadOptimizerOptions options_;
  MemoryLedger* ledger_;
  std::vector<at::Tensor> shards_;
  std::vector<std::vector<HyperSpan>> spans_;  // per group
  std::vector<HostState> host_;                // cpu, per group
  std::vector<LedgerEntry> entries_;
  NvmeState nvme_;
  GroupHooks hooks_;
  int64_t steps_ = 0;
  std::vector<double> grad_squares_;       // per group, this step's
  std::unique_ptr<ShardUploads> uploads_;  // shards on a GPU
};

}  // namespace zeroshard
