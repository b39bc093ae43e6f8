#include "optim/ResidentOptimizer.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>

namespace zeroshard {

AdamKernel fused_adam_kernel() {
  return [](const AdamHyper& h, int64_t step, double grad_scale, at::Tensor& master,
            at::Tensor& grad, at::Tensor& m, at::Tensor& v) {
    const auto on = master.options();  // fp32, where the state is
    // The count the kernel reads (torch.optim increments it before the call).
    const at::Tensor steps = at::full({}, static_cast<double>(step), on);
    std::optional<at::Tensor> divisor;
    if (grad_scale != 1.0) divisor = at::full({}, 1.0 / grad_scale, on);
    if (h.decoupled) {
      at::_fused_adamw_({master}, {grad}, {m}, {v}, {}, {steps}, h.lr, h.beta1, h.beta2,
                        h.weight_decay, h.eps, /*amsgrad=*/false, /*maximize=*/false, divisor,
                        std::nullopt);
    } else {
      at::_fused_adam_({master}, {grad}, {m}, {v}, {}, {steps}, h.lr, h.beta1, h.beta2,
                       h.weight_decay, h.eps, /*amsgrad=*/false, /*maximize=*/false, divisor,
                       std::nullopt);
    }
  };
}

void ResidentOptimizer::add_group(const at::Tensor& shard, std::vector<HyperSpan> spans) {
  State s;
  s.shard = shard;
  s.spans = std::move(spans);
  const bool fp32 = shard.scalar_type() == at::kFloat;
  s.master = fp32 ? shard : shard.to(at::kFloat);
  s.m = at::zeros_like(s.master);
  s.v = at::zeros_like(s.master);
  const int64_t n = s.master.numel();
  if (!fp32) entries_.emplace_back(ledger_, Tier::Device, Kind::MasterParams, n * 4);
  entries_.emplace_back(ledger_, Tier::Device, Kind::OptimizerStates, n * 8);
  states_.push_back(std::move(s));
}

void ResidentOptimizer::aten_step(const AdamHyper& h, int64_t step, double grad_scale,
                                  at::Tensor master, at::Tensor g, at::Tensor m, at::Tensor v) {
  const double t = static_cast<double>(step);
  const double bias1 = h.bias_correction ? 1 - std::pow(h.beta1, t) : 1.0;
  const double bias2 = h.bias_correction ? 1 - std::pow(h.beta2, t) : 1.0;
  if (grad_scale != 1.0) g.mul_(grad_scale);
  if (h.decoupled) {
    if (h.weight_decay != 0) master.mul_(1 - h.lr * h.weight_decay);
  } else if (h.weight_decay != 0) {
    g = g.add(master, h.weight_decay);
  }
  m.mul_(h.beta1).add_(g, 1 - h.beta1);
  v.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
  const at::Tensor denom = (v.sqrt() / std::sqrt(bias2)).add_(h.eps);
  master.addcdiv_(m, denom, -h.lr / bias1);
}

void ResidentOptimizer::step(const std::vector<at::Tensor>& grads, double grad_scale,
                             const std::vector<AdamHyper>& hypers) {
  ++steps_;
  for (size_t i = 0; i < states_.size(); ++i) {
    State& s = states_[i];
    const at::Tensor& grad = grads[i];
    for_each_span(s.spans, hypers, 0, s.master.numel(),
                  [&](int64_t begin, int64_t count, const AdamHyper& h) {
                    at::Tensor master = s.master.narrow(0, begin, count);
                    at::Tensor g = grad.narrow(0, begin, count);
                    at::Tensor m = s.m.narrow(0, begin, count);
                    at::Tensor v = s.v.narrow(0, begin, count);
                    if (kernel_ && h.bias_correction) {  // torch's kernel always corrects
                      kernel_(h, steps_, grad_scale, master, g, m, v);
                    } else {
                      aten_step(h, steps_, grad_scale, master, g, m, v);
                    }
                  });
    if (s.master.data_ptr() != s.shard.data_ptr()) s.shard.copy_(s.master);
  }
}

void ResidentOptimizer::reload_master(size_t group) {
  State& s = states_.at(group);
  if (s.master.data_ptr() != s.shard.data_ptr()) s.master.copy_(s.shard);
}

void ResidentOptimizer::read_state(size_t group, float* master, float* m, float* v) {
  const State& s = states_.at(group);
  const int64_t n = s.m.numel();
  host_floats(master, n).copy_(s.master);
  host_floats(m, n).copy_(s.m);
  host_floats(v, n).copy_(s.v);
}

void ResidentOptimizer::write_state(size_t group, const float* master, const float* m,
                                    const float* v) {
  State& s = states_.at(group);
  const int64_t n = s.m.numel();
  s.master.copy_(host_floats(master, n));
  s.m.copy_(host_floats(m, n));
  s.v.copy_(host_floats(v, n));
  if (s.master.data_ptr() != s.shard.data_ptr()) s.shard.copy_(s.master);
}

void ResidentOptimizer::read_state(size_t group, const std::vector<float*>& arrays) {
  if (arrays.size() != 3)
    fail("ResidentOptimizer::read_state: {} arrays; Adam keeps 3", arrays.size());
  read_state(group, arrays[0], arrays[1], arrays[2]);
}

void ResidentOptimizer::write_state(size_t group, const std::vector<std::string>& names,
                                    const std::vector<const float*>& arrays) {
  check_state_names(names, adam_state_names(), "zeroshard's Adam/AdamW");
  if (arrays.size() != 3)
    fail("ResidentOptimizer::write_state: {} arrays; Adam keeps 3", arrays.size());
  write_state(group, arrays[0], arrays[1], arrays[2]);
}

}  // namespace zeroshard
