#pragma once
// ExternalOptimizer: an optimizer zeroshard does not implement, stepped through hooks on
// this rank's shards: torch.optim's classes and client optimizer objects, which the
// Python package steps (bindings/zeroshard/_engine/torch_optimizer.py). The engine keeps for it
// what it keeps for its own Adam: each group's fp32 master (the shard itself in fp32
// training where the optimizer stays with the parameters; a copy in mixed precision or
// in host RAM with offload_optimizer cpu), and the reduced, scaled fp32 gradients. The
// hooks own the state and the update; the engine writes the updated master back to the
// compute-precision shard, counts the state in the ledger, and checkpoints it as named
// arrays (engine/Checkpoint.h).
// With offload_optimizer.device nvme the engine keeps the per-element state itself, in
// swap regions (optim/PagedState.h) streamed through pinned buffers: read ahead, the
// hooks' update of that region, write behind. The masters stay in host RAM; the hooks
// keep only the per-group scalars (step counts) between steps.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/MemoryLedger.h"
#include "optim/PagedState.h"
#include "optim/ShardOptimizer.h"

namespace zeroshard {

struct ExternalOptimizerHooks {
  // Updates every group's master in place from its gradient (fp32, where the master is,
  // already the mean over ranks and micro-batches, clipped). hypers[g]: parameter group
  // g's hyperparameters as the engine holds them (a scheduler's lr included).
  std::function<void(const std::vector<at::Tensor>& grads, const std::vector<AdamHyper>& hypers)>
      step;
  // The per-element state arrays, by name, the same on every rank from the start.
  std::function<std::vector<std::string>()> state_names;
  // Group `group`'s arrays, host fp32 tensors of the group's numel in state_names' order:
  // read_state fills them (zeros where no state exists yet); write_state takes them.
  std::function<void(size_t group, const std::vector<at::Tensor>& arrays)> read_state;
  std::function<void(size_t group, const std::vector<at::Tensor>& arrays)> write_state;
  // Per-parameter-group state that is not per element, as JSON, and its restore; `steps`
  // is the engine's step count, for checkpoints that hold none (the built-in Adam's).
  std::function<std::string()> scalar_state;
  std::function<void(const std::string& json, int64_t steps)> set_scalar_state;
  // Bytes of state held now (the ledger's optimizer_states).
  std::function<int64_t()> state_bytes;
  // NVMe only; an optimizer without them (one needing whole parameters in one step) is
  // refused there. release_state: from now on the engine keeps the per-element state
  // (read_state has just given it); the hooks drop theirs. step_region: updates the
  // elements of swap region `region` from that group's whole gradient `grad`; `arrays`
  // are the region's state, host fp32 tensors of its numel in state_names' order, which
  // the update leaves holding the new state.
  std::function<void()> release_state;
  std::function<void(size_t region, const at::Tensor& grad, const std::vector<AdamHyper>& hypers,
                     const std::vector<at::Tensor>& arrays)>
      step_region;
};

class ExternalOptimizer : public ShardOptimizer {
 public:
  // `name`: the class, for messages; `tier`: where the masters and the state live
  // (host with `swap`, the state on NVMe).
  ExternalOptimizer(std::string name, Tier tier, MemoryLedger* ledger,
                    std::optional<ExternalStateSwap> swap = std::nullopt);
  ~ExternalOptimizer() override;

  void add_group(const at::Tensor& shard, std::vector<HyperSpan> spans = {}) override;
  // What the hooks' owner builds its optimizer on: each group's master and spans.
  const std::vector<at::Tensor>& masters() const { return masters_; }
  const std::vector<HyperSpan>& spans(size_t group) const { return spans_.at(group); }
  void add_param_pieces(size_t group, std::vector<ParamPiece> pieces, size_t params) override;
  // Which parameter each piece of a group's shard is (every trainable parameter appears,
  // with count 0 where another rank's shard holds it), for a class whose update needs
  // whole-parameter statistics.
  const std::vector<ParamPiece>& pieces(size_t group) const { return pieces_.at(group); }
  size_t piece_groups() const { return pieces_.size(); }
  // With NVMe: every group's swap regions, in order (empty without).
  const std::vector<StateRegion>& regions() const;
  void set_hooks(ExternalOptimizerHooks hooks);

  using ShardOptimizer::step;
  void step(const std::vector<at::Tensor>& grads, double grad_scale,
            const std::vector<AdamHyper>& hypers) override;
  int64_t steps() const override { return steps_; }
  size_t groups() const override { return shards_.size(); }
  void reload_master(size_t group) override;
  int64_t group_numel(size_t group) const override { return masters_.at(group).numel(); }
  std::vector<std::string> state_names() const override;
  void read_state(size_t group, const std::vector<float*>& arrays) override;
  void write_state(size_t group, const std::vector<std::string>& names,
                   const std::vector<const float*>& arrays) override;
  std::string scalar_state() const override;
  void set_scalar_state(const std::string& json) override;
  void set_steps(int64_t steps) override { steps_ = steps; }

 private:
  const ExternalOptimizerHooks& hooks() const;
  void write_back(size_t group);  // master -> compute-precision shard
  void count_state();
  void open_swap();  // NVMe: the swap regions, holding the state the hooks had
  bool paged() const { return paged_ && paged_->is_open(); }  // per-element state on NVMe

  std::string name_;
  Tier tier_;
  MemoryLedger* ledger_;
  std::vector<at::Tensor> shards_, masters_;
  std::vector<std::vector<HyperSpan>> spans_;
  std::vector<std::vector<ParamPiece>> pieces_;
  std::vector<LedgerEntry> master_entries_;
  LedgerEntry state_entry_;
  ExternalOptimizerHooks hooks_;
  bool hooked_ = false;
  int64_t steps_ = 0;
  std::unique_ptr<PagedState> paged_;  // NVMe
};

}  // namespace zeroshard
