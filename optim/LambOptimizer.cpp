#include "optim/LambOptimizer.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

namespace zeroshard {

LambOptimizer::LambOptimizer(LambOptions options, Tier tier, MemoryLedger* ledger,
                             NormReduce reduce)
    : options_(options), tier_(tier), ledger_(ledger), reduce_(std::move(reduce)) {}

void LambOptimizer::add_group(const at::Tensor& shard, std::vector<HyperSpan> spans) {
  Group g;
  g.shard = shard;
  g.spans = std::move(spans);
  g.master = fp32_master(shard, tier_ == Tier::Host);
  g.m = at::zeros_like(g.master);
  g.v = at::zeros_like(g.master);
  const int64_t n = g.master.numel();
  if (!g.master.is_same(shard)) entries_.emplace_back(ledger_, tier_, Kind::MasterParams, n * 4);
  entries_.emplace_back(ledger_, tier_, Kind::OptimizerStates, n * 8);
  groups_.push_back(std::move(g));
}

void LambOptimizer::add_param_pieces(size_t group, std::vector<ParamPiece> pieces, size_t params) {
  groups_.at(group).pieces = std::move(pieces);
  params_ = std::max(params_, params);
}

void LambOptimizer::update_into(Group& g, at::Tensor& grad, const std::vector<AdamHyper>& hypers) {
  for_each_span(g.spans, hypers, 0, g.master.numel(),
                [&](int64_t begin, int64_t count, const AdamHyper& h) {
                  at::Tensor gr = grad.narrow(0, begin, count);
                  at::Tensor m = g.m.narrow(0, begin, count);
                  at::Tensor v = g.v.narrow(0, begin, count);
                  m.mul_(h.beta1).add_(gr, 1 - h.beta1);
                  v.mul_(h.beta2).addcmul_(gr, gr, 1 - h.beta2);
                  const at::Tensor denom =
                      options_.eps_inside_sqrt ? (v + h.eps).sqrt_() : v.sqrt().add_(h.eps);
                  at::div_out(gr, m, denom);  // the update, where the gradient was
                  if (h.weight_decay != 0)
                    gr.add_(g.master.narrow(0, begin, count), h.weight_decay);
                });
}

at::Tensor LambOptimizer::squared_norms(const std::vector<at::Tensor>& updates) {
  std::vector<at::Tensor> w2, u2;
  std::vector<int64_t> index;
  for (size_t i = 0; i < groups_.size(); ++i) {
    for (const ParamPiece& p : groups_[i].pieces) {
      if (p.count == 0) continue;  // held by another rank's shard
      w2.push_back(groups_[i].master.narrow(0, p.begin, p.count).square().sum());
      u2.push_back(updates[i].narrow(0, p.begin, p.count).square().sum());
      index.push_back(static_cast<int64_t>(p.param));
    }
  }
  const auto device = groups_.empty() ? at::Device(at::kCPU) : groups_[0].master.device();
  at::Tensor norms = at::zeros({2, static_cast<int64_t>(params_)},
                               at::TensorOptions().dtype(at::kDouble).device(device));
  if (!index.empty()) {
    // The pieces never change: their parameters' indices go to the device once.
    if (!piece_params_.defined()) piece_params_ = at::tensor(index, at::kLong).to(device);
    norms.select(0, 0).index_add_(0, piece_params_, at::stack(w2).to(at::kDouble));
    norms.select(0, 1).index_add_(0, piece_params_, at::stack(u2).to(at::kDouble));
  }
  reduce_(norms);
  return norms.to(at::kCPU);
}

void LambOptimizer::apply(Group& g, const at::Tensor& update, const std::vector<double>& ratios,
                          const std::vector<AdamHyper>& hypers) {
  for (const ParamPiece& p : g.pieces) {
    for_each_span(g.spans, hypers, p.begin, p.count,
                  [&](int64_t begin, int64_t count, const AdamHyper& h) {
                    double step = h.lr;
                    if (options_.bias_correction) {
                      const double t = static_cast<double>(steps_);
                      step *= std::sqrt(1 - std::pow(h.beta2, t)) / (1 - std::pow(h.beta1, t));
                    }
                    g.master.narrow(0, begin, count)
                        .add_(update.narrow(0, begin, count), -step * ratios[p.param]);
                  });
  }
  if (g.master.data_ptr() != g.shard.data_ptr()) g.shard.copy_(g.master);
}

void LambOptimizer::step(const std::vector<at::Tensor>& grads, double grad_scale,
                         const std::vector<AdamHyper>& hypers) {
  ++steps_;
  std::vector<at::Tensor> updates;
  for (size_t i = 0; i < groups_.size(); ++i) {
    at::Tensor u = grads.at(i);
    if (u.device() != groups_[i].master.device()) u = u.to(groups_[i].master.device());
    if (grad_scale != 1.0) u.mul_(grad_scale);
    update_into(groups_[i], u, hypers);
    updates.push_back(u);
  }
  const at::Tensor norms = squared_norms(updates);
  const auto* w2 = norms.data_ptr<double>();
  const auto* u2 = w2 + params_;
  std::vector<double> ratios(params_, 1.0);
  for (size_t p = 0; p < params_; ++p) {
    const double w = std::sqrt(w2[p]), u = std::sqrt(u2[p]);
    if (w != 0 && u != 0) ratios[p] = std::clamp(w / u, options_.min_coeff, options_.max_coeff);
  }
  for (size_t i = 0; i < groups_.size(); ++i) apply(groups_[i], updates[i], ratios, hypers);
}

void LambOptimizer::reload_master(size_t group) {
  Group& g = groups_.at(group);
  if (g.master.data_ptr() != g.shard.data_ptr()) g.master.copy_(g.shard);
}

void LambOptimizer::read_state(size_t group, const std::vector<float*>& arrays) {
  if (arrays.size() != 3) fail("LambOptimizer::read_state: {} arrays; Lamb keeps 3", arrays.size());
  const Group& g = groups_.at(group);
  const int64_t n = g.m.numel();
  host_floats(arrays[0], n).copy_(g.master);
  host_floats(arrays[1], n).copy_(g.m);
  host_floats(arrays[2], n).copy_(g.v);
}

void LambOptimizer::write_state(size_t group, const std::vector<std::string>& names,
                                const std::vector<const float*>& arrays) {
  check_state_names(names, adam_state_names(), "Lamb");
  if (arrays.size() != 3)
    fail("LambOptimizer::write_state: {} arrays; Lamb keeps 3", arrays.size());
  Group& g = groups_.at(group);
  const int64_t n = g.m.numel();
  g.master.copy_(host_floats(arrays[0], n));
  g.m.copy_(host_floats(arrays[1], n));
  g.v.copy_(host_floats(arrays[2], n));
  if (g.master.data_ptr() != g.shard.data_ptr()) g.shard.copy_(g.master);
}

}  // namespace zeroshard
