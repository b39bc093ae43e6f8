#include "sharding/OptimizerShard.h"

#include <cmath>

#include <ATen/ATen.h>

namespace zeroshard {

void OptimizerShard::add_group(const at::Tensor& shard) {
  State s;
  s.shard = shard;
  const bool fp32 = shard.scalar_type() == at::kFloat;
  s.master = fp32 ? shard : shard.to(at::kFloat);
  s.m = at::zeros_like(s.master);
  s.v = at::zeros_like(s.master);
  const int64_t n = s.master.numel();
  if (!fp32) entries_.emplace_back(ledger_, Tier::Device, Kind::MasterParams, n * 4);
  entries_.emplace_back(ledger_, Tier::Device, Kind::OptimizerStates, n * 8);
  states_.push_back(std::move(s));
}

void OptimizerShard::aten_step(const AdamHyper& h, double bias1, double bias2, double grad_scale,
                               State& s, at::Tensor g) {
  if (grad_scale != 1.0) g.mul_(grad_scale);
  if (h.decoupled) {
    if (h.weight_decay != 0) s.master.mul_(1 - h.lr * h.weight_decay);
  } else if (h.weight_decay != 0) {
    g = g.add(s.master, h.weight_decay);
  }
  s.m.mul_(h.beta1).add_(g, 1 - h.beta1);
  s.v.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
  const at::Tensor denom = (s.v.sqrt() / std::sqrt(bias2)).add_(h.eps);
  s.master.addcdiv_(s.m, denom, -h.lr / bias1);
}

void OptimizerShard::step(const std::vector<at::Tensor>& grads, double grad_scale,
                          const AdamHyper& h) {
  ++steps_;
  const double bias1 = 1 - std::pow(h.beta1, static_cast<double>(steps_));
  const double bias2 = 1 - std::pow(h.beta2, static_cast<double>(steps_));
  for (size_t i = 0; i < states_.size(); ++i) {
    State& s = states_[i];
    at::Tensor g = grads[i];
    if (kernel_) {
      kernel_(h, steps_, grad_scale, s.master, g, s.m, s.v);
    } else {
      aten_step(h, bias1, bias2, grad_scale, s, g);
    }
    if (s.master.data_ptr() != s.shard.data_ptr()) s.shard.copy_(s.master);
  }
}

void OptimizerShard::reload_master(size_t group) {
  State& s = states_.at(group);
  if (s.master.data_ptr() != s.shard.data_ptr()) s.master.copy_(s.shard);
}

namespace {

at::Tensor view_of(const float* data, int64_t n) {
  return at::from_blob(const_cast<float*>(data), {n}, at::kFloat);
}

}  // namespace

void OptimizerShard::read_state(size_t group, float* master, float* m, float* v) {
  const State& s = states_.at(group);
  const int64_t n = s.m.numel();
  view_of(master, n).copy_(s.master);
  view_of(m, n).copy_(s.m);
  view_of(v, n).copy_(s.v);
}

void OptimizerShard::write_state(size_t group, const float* master, const float* m,
                                 const float* v) {
  State& s = states_.at(group);
  const int64_t n = s.m.numel();
  s.master.copy_(view_of(master, n));
  s.m.copy_(view_of(m, n));
  s.v.copy_(view_of(v, n));
  if (s.master.data_ptr() != s.shard.data_ptr()) s.shard.copy_(s.master);
}

}  // namespace zeroshard
