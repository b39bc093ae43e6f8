#include "sharding/GradReducer.h"

#include <chrono>
#include <cmath>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "common/FaultPoint.h"

namespace zeroshard {
namespace {

// Reduced gradients for an offloaded optimizer live in host memory, page-locked when the
// gradients come from a GPU (the copies from the device then run at full speed).
at::TensorOptions fp32_options(const at::Tensor& grad, Tier tier) {
  const auto options = grad.options().dtype(at::kFloat);
  if (tier == Tier::Device) return options;
  return options.device(at::kCPU).pinned_memory(!grad.device().is_cpu());
}

}  // namespace

GradReducer::GradReducer(std::vector<FlatParamGroup*> groups, int stage, bool overlap,
                         Collectives* comm, Collectives* replicas, MemoryLedger* ledger,
                         Tier fp32_tier)
    : groups_(std::move(groups)),
      stage_(stage),
      overlap_(overlap),
      comm_(comm),
      replicas_(replicas),
      ledger_(ledger) {
  for (FlatParamGroup* g : groups_) {
    const at::Tensor& grad = g->flat_grad();
    // fp32 stage 0/1 reduce in place in the gradient buffer itself; otherwise a separate
    // fp32 buffer holds the reduced (and, at stage >= 2, accumulated) gradient.
    if (grad.scalar_type() == at::kFloat && stage_ <= 1 && fp32_tier == Tier::Device) {
      fp32_.push_back(stage_ == 0 ? grad : g->grad_shard());
      fp32_entries_.emplace_back();
    } else {
      const int64_t n = stage_ == 0 ? g->padded_numel() : g->shard_numel();
      fp32_.push_back(at::zeros({n}, fp32_options(grad, fp32_tier)));
      fp32_entries_.emplace_back(ledger, fp32_tier, Kind::GradsFp32, n * 4);
    }
  }
  received_entry_ = LedgerEntry(ledger, Tier::Device, Kind::CommBuckets, 0);
  const c10::Device grads_on =
      groups_.empty() ? c10::Device(at::kCPU) : groups_.front()->flat_grad().device();
  if (stage_ >= 2 && fp32_tier != Tier::Device && !grads_on.is_cpu()) {
    copies_ = std::make_unique<CopyStream>(grads_on);
  }
  landings_.resize(groups_.size());
  landing_mutexes_ = std::make_unique<std::mutex[]>(groups_.size());
  clean_.assign(groups_.size(), true);
  install_hooks();
}

GradReducer::~GradReducer() = default;

void GradReducer::install_hooks() {
  expected_.assign(groups_.size(), 0);
  arrived_.assign(groups_.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& slots = groups_[g]->slots();
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!slots[i].param.requires_grad()) continue;
      ++expected_[g];
      at::Tensor param = slots[i].param;
      // Before autograd accumulates into the group's buffer, the buffer must exist and
      // the parameter's .grad be its view again.
      param.register_hook([this, g, i](const at::Tensor& grad) {
        if (on_gradient_) on_gradient_(g, i);
        groups_[g]->materialize_grads();
        groups_[g]->keep_grad_view(i);
        return grad;
      });
      auto accumulator = torch::autograd::impl::grad_accumulator(param);
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, g](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
            on_accumulated(g);
            return outputs;
          }));
      accumulators_.push_back(std::move(accumulator));  // keeps the hooks alive
    }
  }
}

void GradReducer::begin_backward(bool boundary) {
  reducing_ = stage_ >= 2 || boundary;
  boundary_ = boundary;
  next_ = static_cast<int>(groups_.size()) - 1;
  std::fill(arrived_.begin(), arrived_.end(), 0);
}

void GradReducer::on_accumulated(size_t group) {
  if (++arrived_[group] == expected_[group] && on_complete_) on_complete_(group);
  if (reducing_) launch_ready();
}

void GradReducer::launch_ready() {
  while (next_ >= 0 && arrived_[next_] >= expected_[next_]) launch(next_--);
}

void GradReducer::launch(size_t g) {
  // overlap_comm lets two groups be in flight while backward goes on; without it each
  // group is retired before the next is launched.
  const size_t max_in_flight = overlap_ ? 2 : 1;
  if (stage_ >= 2) {
    while (in_flight_.size() >= max_in_flight) {
      wait_issuing_gathers(in_flight_.front().handle);
      retire_oldest();
    }
  }
  fault_point("backward.reduce");
  groups_[g]->materialize_grads();  // a group no gradient reached this step
  InFlight f;
  f.group = g;
  if (stage_ == 0) {
    if (fp32_[g].data_ptr() != groups_[g]->flat_grad().data_ptr()) {
      fp32_[g].copy_(groups_[g]->flat_grad());
    }
    f.handle = comm_->all_reduce_sum(fp32_[g]);
  } else if (stage_ == 1) {
    f.handle = comm_->reduce_scatter_sum(groups_[g]->flat_grad(), fp32_[g]);
  } else {
    // Reduced where the gradients are (a landing brings it to a host accumulator).
    f.received = at::empty(fp32_[g].sizes(), groups_[g]->flat_grad().options().dtype(at::kFloat));
    received_entry_.resize(received_entry_.bytes() + f.received.numel() * 4);
    f.handle = comm_->reduce_scatter_sum(groups_[g]->flat_grad(), f.received);
  }
  in_flight_.push_back(std::move(f));
}

void GradReducer::wait_issuing_gathers(const CommHandle& handle) {
  constexpr auto kPatience = std::chrono::milliseconds(20);
  auto since = std::chrono::steady_clock::now();
  while (advance_ && !handle.ready()) {
    if (std::chrono::steady_clock::now() - since < kPatience) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (!advance_()) return;  // nothing left to issue: a plain wait cannot block a peer
    since = std::chrono::steady_clock::now();
  }
}

void GradReducer::retire_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.erase(in_flight_.begin());
  f.handle.wait();
  if (stage_ >= 2) groups_[f.group]->release_grads();  // the shard is in f.received
  if (!replicas_) {
    accumulate(f);
    return finished(f.group);
  }
  // Across groups: the shard's all-reduce (the slow link's share) runs while the next
  // group's reduce-scatter does; one is kept in flight.
  f.handle = replicas_->all_reduce_sum(stage_ >= 2 ? f.received : fp32_[f.group]);
  across_.push_back(std::move(f));
  if (across_.size() > 1) finish_across();
}

void GradReducer::finish_across() {
  InFlight f = std::move(across_.front());
  across_.erase(across_.begin());
  wait_issuing_gathers(f.handle);
  f.handle.wait();
  accumulate(f);
  finished(f.group);
}

void GradReducer::accumulate(const InFlight& f) {
  if (stage_ < 2) return;  // stages 0-1 reduce into fp32_ itself
  if (copies_) return land(f);
  // 0 + x is x: the first micro-batch's shard is copied in (as a landing is).
  if (clean_[f.group]) {
    fp32_[f.group].copy_(f.received);
  } else {
    fp32_[f.group].add_(f.received);
  }
  clean_[f.group] = false;
  received_entry_.resize(received_entry_.bytes() - f.received.numel() * 4);
}

void GradReducer::land(const InFlight& f) {
  const size_t g = f.group;
  // Bounded: settle the oldest (most likely ended already) before another begins.
  while (landing_order_.size() >= 2) {
    settled(landing_order_.front());
    landing_order_.pop_front();
  }
  settled(g);  // an earlier landing of this group, if one is left
  const int64_t bytes = f.received.numel() * 4;
  std::lock_guard<std::mutex> lock(landing_mutexes_[g]);
  Landing l;
  received_entry_.resize(received_entry_.bytes() - bytes);
  l.device_bytes = LedgerEntry(ledger_, Tier::Device, Kind::CommBuckets, bytes);
  if (clean_[g]) {  // straight into the accumulator
    l.done = copies_->copy(fp32_[g], f.received);
  } else {
    l.staging = at::empty(fp32_[g].sizes(), fp32_[g].options().pinned_memory(true));
    l.host_bytes = LedgerEntry(ledger_, Tier::Host, Kind::PinnedBuffers, bytes);
    l.done = copies_->copy(l.staging, f.received);
  }
  clean_[g] = false;
  landings_[g] = std::move(l);
  landing_order_.push_back(g);
}

const at::Tensor& GradReducer::settled(size_t group) {
  std::lock_guard<std::mutex> lock(landing_mutexes_[group]);
  std::optional<Landing>& l = landings_.at(group);
  if (l) {
    l->done.wait();
    if (l->staging.defined()) fp32_[group].add_(l->staging);
    l.reset();
  }
  return fp32_[group];
}

void GradReducer::settle_all() {
  for (size_t g = 0; g < groups_.size(); ++g) settled(g);
  landing_order_.clear();
}

void GradReducer::finished(size_t group) {
  if (boundary_ && on_reduced_) on_reduced_(group);
}

void GradReducer::drain() {
  while (!in_flight_.empty()) retire_oldest();
  while (!across_.empty()) finish_across();
}

void GradReducer::end_backward() {
  if (!reducing_) return;
  // Whatever did not arrive (unused parameters) counts as zero: launch the rest.
  while (next_ >= 0) launch(next_--);
  if (stage_ >= 2) drain();
  settle_all();
}

const std::vector<at::Tensor>& GradReducer::reduced() {
  drain();
  settle_all();
  return fp32_;
}

double GradReducer::global_norm(double scale) {
  // One fp32 pass per buffer (no double copy of the gradients); squares summed in double.
  settle_all();
  double local = 0;
  for (const auto& g : fp32_) {
    const double norm = g.norm().item<double>();
    local += norm * norm;
  }
  at::Tensor sq = at::full({1}, local, at::kDouble);
  // Stage 0 holds identical full gradients on every rank; the shards need a sum.
  if (sharded_grads()) comm_->all_reduce_sum(sq).wait();
  return std::sqrt(sq.item<double>()) * std::abs(scale);
}

bool GradReducer::any_overflow() {
  settle_all();
  at::Tensor bad = at::zeros({1});
  for (const auto& g : fp32_)
    if (!at::isfinite(g).all().item<bool>()) bad.fill_(1);
  if (sharded_grads()) comm_->all_reduce_sum(bad).wait();
  return bad.item<float>() > 0;
}

void GradReducer::zero() {
  settle_all();  // no copy may still be writing into an accumulator
  clean_.assign(groups_.size(), true);
  for (size_t i = 0; i < groups_.size(); ++i) {
    groups_[i]->zero_grads();
    // fp32 at stages 0-1 reduces in the gradient buffer itself: already zeroed above.
    if (!fp32_[i].is_alias_of(groups_[i]->flat_grad())) fp32_[i].zero_();
  }
}

}  // namespace zeroshard
