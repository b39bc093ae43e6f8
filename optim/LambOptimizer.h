#pragma once
// LambOptimizer: DeepSpeed's Lamb (the arithmetic of its FusedLamb) over this rank's
// shards. Per parameter: Adam's moments, the update u = m / (sqrt(v) + eps) + wd * w
// (eps inside the root with eps_inside_sqrt), and the trust ratio ||w|| / ||u|| clamped
// to [min_coeff, max_coeff] (1 where either norm is 0); then w -= step * ratio * u with
// step = lr * sqrt(1 - beta2^t) / (1 - beta1^t) (lr without bias_correction).
//
// A shard holds pieces of parameters, so the norms are sums of squares over each piece
// (add_param_pieces says which parameter each is), summed across the ranks that share
// the shards by `reduce` (one all-reduce per step of two numbers per parameter), then
// every rank applies its pieces' ratios: exactly the whole parameters' ratios, up to
// the order of the sums. State lives where the masters do: with the parameters (the
// shard is the master in fp32), or in host RAM with offload_optimizer cpu.
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"
#include "optim/ShardOptimizer.h"

namespace zeroshard {

struct LambOptions {
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
};

// Sums a float64 tensor over the ranks that hold the other shards, in place.
using NormReduce = std::function<void(at::Tensor&)>;

class LambOptimizer : public ShardOptimizer {
 public:
  LambOptimizer(LambOptions options, Tier tier, MemoryLedger* ledger, NormReduce reduce);

  void add_group(const at::Tensor& shard, std::vector<HyperSpan> spans = {}) override;
  void add_param_pieces(size_t group, std::vector<ParamPiece> pieces, size_t params) override;
  using ShardOptimizer::step;
  void step(const std::vector<at::Tensor>& grads, double grad_scale,
            const std::vector<AdamHyper>& hypers) override;
  int64_t steps() const override { return steps_; }
  size_t groups() const override { return groups_.size(); }
  void reload_master(size_t group) override;
  int64_t group_numel(size_t group) const override { return groups_.at(group).m.numel(); }
  std::vector<std::string> state_names() const override { return adam_state_names(); }
  void read_state(size_t group, const std::vector<float*>& arrays) override;
  void write_state(size_t group, const std::vector<std::string>& names,
                   const std::vector<const float*>& arrays) override;
  void set_steps(int64_t steps) override { steps_ = steps; }

 private:
  struct Group {
    at::Tensor shard, master, m, v;
    std::vector<HyperSpan> spans;
    std::vector<ParamPiece> pieces;
  };
  // Moments, and the update into `grad` (no longer needed after the moments).
  void update_into(Group& g, at::Tensor& grad, const std::vector<AdamHyper>& hypers);
  // Per parameter, ||w||^2 and ||u||^2 over every rank's pieces: [2, params].
  at::Tensor squared_norms(const std::vector<at::Tensor>& updates);
  void apply(Group& g, const at::Tensor& update, const std::vector<double>& ratios,
             const std::vector<AdamHyper>& hypers);

  LambOptions options_;
  Tier tier_;
  MemoryLedger* ledger_;
  NormReduce reduce_;
  std::vector<Group> groups_;
  std::vector<LedgerEntry> entries_;
  size_t params_ = 0;
  at::Tensor piece_params_;  // each held piece's parameter, in squared_norms' order
  int64_t steps_ = 0;
};

}  // namespace zeroshard
