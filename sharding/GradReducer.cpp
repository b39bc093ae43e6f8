#include "sharding/GradReducer.h"

#include <cmath>

#include <ATen/ATen.h>

namespace zeroshard {

GradReducer::GradReducer(std::vector<FlatParamGroup*> groups, int stage, Collectives* comm,
                         MemoryLedger* ledger)
    : groups_(std::move(groups)), stage_(stage), comm_(comm) {
  for (FlatParamGroup* g : groups_) {
    const at::Tensor& grad = g->flat_grad();
    const bool fp32 = grad.scalar_type() == at::kFloat;
    // fp32 stage 0/1 reduce in place in the gradient buffer itself; otherwise a separate
    // fp32 buffer holds the reduced (and, at stage >= 2, accumulated) gradient.
    if (fp32 && stage_ <= 1) {
      fp32_.push_back(stage_ == 0 ? grad : g->grad_shard());
      fp32_entries_.emplace_back();
    } else {
      const int64_t n = stage_ == 0 ? g->padded_numel() : g->shard_numel();
      fp32_.push_back(at::zeros({n}, grad.options().dtype(at::kFloat)));
      fp32_entries_.emplace_back(ledger, Tier::Device, Kind::GradsFp32, n * 4);
    }
  }
}

void GradReducer::before_backward() {
  if (stage_ >= 2)
    for (FlatParamGroup* g : groups_) g->materialize_grads();
}

void GradReducer::after_backward() {
  if (stage_ < 2) return;
  std::vector<CommHandle> handles;
  std::vector<at::Tensor> received;
  for (size_t i = 0; i < groups_.size(); ++i) {
    received.push_back(at::empty_like(fp32_[i]));
    handles.push_back(comm_->reduce_scatter_sum(groups_[i]->flat_grad(), received.back()));
  }
  for (size_t i = 0; i < groups_.size(); ++i) {
    handles[i].wait();
    fp32_[i].add_(received[i]);
    groups_[i]->release_grads();
  }
}

const std::vector<at::Tensor>& GradReducer::reduce_for_step() {
  if (stage_ >= 2) return fp32_;
  std::vector<CommHandle> handles;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const at::Tensor& grad = groups_[i]->flat_grad();
    if (stage_ == 0) {
      if (fp32_[i].data_ptr() != grad.data_ptr()) fp32_[i].copy_(grad);
      handles.push_back(comm_->all_reduce_sum(fp32_[i]));
    } else {
      handles.push_back(comm_->reduce_scatter_sum(grad, fp32_[i]));
    }
  }
  for (auto& h : handles) h.wait();
  return fp32_;
}

double GradReducer::global_norm(double scale) {
  at::Tensor sq = at::zeros({1}, at::kDouble);
  for (const auto& g : fp32_) sq += g.to(at::kDouble).pow(2).sum();
  // Stage 0 holds identical full gradients on every rank; the shards need a sum.
  if (sharded_grads()) comm_->all_reduce_sum(sq).wait();
  return std::sqrt(sq.item<double>()) * std::abs(scale);
}

bool GradReducer::any_overflow() {
  at::Tensor bad = at::zeros({1});
  for (const auto& g : fp32_)
    if (!at::isfinite(g).all().item<bool>()) bad.fill_(1);
  if (sharded_grads()) comm_->all_reduce_sum(bad).wait();
  return bad.item<float>() > 0;
}

void GradReducer::zero() {
  for (FlatParamGroup* g : groups_) g->zero_grads();
  for (auto& t : fp32_) t.zero_();
}

}  // namespace zeroshard
