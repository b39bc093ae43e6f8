#include "sharding/GradReducer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include <ATen/ATen.h>
#include <fmt/format.h>
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

GradReducer::GradReducer(std::vector<FlatParamGroup*> groups, ReduceOptions options,
                         Collectives* comm, Collectives* replicas, MemoryLedger* ledger)
    : groups_(std::move(groups)),
      options_(options),
      comm_(comm),
      replicas_(replicas),
      ledger_(ledger) {
  // Stages 0-1 reduce once per window into a buffer that holds the whole sum; from stage 2
  // on each backward's reduced shard is accumulated in an fp32 buffer of its own.
  const bool whole_groups = !options_.stage.shards_optimizer();
  const bool accumulates_reduced = options_.stage.shards_gradients();
  bool any_off_device = false;
  for (size_t i = 0; i < groups_.size(); ++i) {
    FlatParamGroup* g = groups_[i];
    const Tier fp32_tier = this->fp32_tier(i);
    any_off_device = any_off_device || fp32_tier != Tier::Device;
    const at::Tensor& grad = g->flat_grad();
    // fp32 stage 0/1 reduce in place in the gradient buffer itself; otherwise a separate
    // fp32 buffer holds the reduced (and, at stage >= 2, accumulated) gradient.
    if (grad.scalar_type() == at::kFloat && !accumulates_reduced && fp32_tier == Tier::Device) {
      sums_.fp32.push_back(whole_groups ? grad : g->grad_shard());
      sums_.entries.emplace_back();
    } else {
      const int64_t n = whole_groups ? g->padded_numel() : g->shard_numel();
      sums_.fp32.push_back(at::zeros({n}, fp32_options(grad, fp32_tier)));
      sums_.entries.emplace_back(ledger, fp32_tier, Kind::GradsFp32, n * 4);
    }
  }
  reductions_.received_bytes = LedgerEntry(ledger, Tier::Device, Kind::CommBuckets, 0);
  const c10::Device grads_on =
      groups_.empty() ? c10::Device(at::kCPU) : groups_.front()->flat_grad().device();
  if (!whole_groups && any_off_device && !grads_on.is_cpu()) {
    landings_ = std::make_unique<HostLandings>(grads_on, &sums_.fp32, ledger);
  }
  sums_.clean.assign(groups_.size(), true);
  sums_.stale.assign(groups_.size(), 0);
  install_hooks();
}

GradReducer::~GradReducer() = default;

Tier GradReducer::fp32_tier(size_t group) const {
  return group < options_.fp32_tiers.size() ? options_.fp32_tiers[group] : Tier::Device;
}

bool GradReducer::lands(size_t group) const {
  return landings_ && fp32_tier(group) != Tier::Device;
}

void GradReducer::install_hooks() {
  arrivals_.expected.assign(groups_.size(), 0);
  arrivals_.arrived.assign(groups_.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& slots = groups_[g]->slots();
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!slots[i].param.requires_grad()) continue;
      ++arrivals_.expected[g];
      at::Tensor param = slots[i].param;
      // Before autograd accumulates into the group's buffer, the buffer must exist and
      // the parameter's .grad be its view again.
      param.register_hook([this, g, i](const at::Tensor& grad) {
        if (hooks_.on_gradient) hooks_.on_gradient(g, i);
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
      arrivals_.accumulators.push_back(std::move(accumulator));  // keeps the hooks alive
    }
  }
}

void GradReducer::begin_backward(bool boundary) {
  window_.reducing = (options_.stage.shards_gradients() && !once_per_window_) || boundary;
  window_.boundary = boundary;
  window_.next = static_cast<int>(groups_.size()) - 1;
  std::fill(arrivals_.arrived.begin(), arrivals_.arrived.end(), 0);
}

void GradReducer::on_accumulated(size_t group) {
  if (++arrivals_.arrived[group] == arrivals_.expected[group] && hooks_.on_complete) {
    hooks_.on_complete(group);
  }
  if (window_.reducing) launch_ready();
}

void GradReducer::launch_ready() {
  int& next = window_.next;
  while (next >= 0 && arrivals_.arrived[next] >= arrivals_.expected[next]) launch(next--);
}

bool GradReducer::bounded() const {
  return options_.stage.shards_optimizer() || options_.wire.value_or(at::kFloat) != at::kFloat;
}

void GradReducer::launch(size_t g) {
  // overlap_comm lets two groups be in flight while backward goes on; without it each
  // group is retired before the next is launched.
  const size_t max_in_flight = options_.overlap ? 2 : 1;
  while (bounded() && reductions_.in_flight.size() >= max_in_flight) {
    wait_issuing_gathers(reductions_.in_flight.front().handle);
    retire_oldest();
  }
  fault_point("backward.reduce");
  const CollectiveLabel label(fmt::format("gradients of group {}", g));
  groups_[g]->materialize_grads();  // a group no gradient reached this step
  InFlight f;
  f.group = g;
  sums_.stale[g] = 0;  // stages 0-1 write the whole sum; later ones land in it whole or add
  const std::optional<at::ScalarType> wire = options_.wire;
  if (!options_.stage.shards_optimizer()) {
    if (sums_.fp32[g].data_ptr() != groups_[g]->flat_grad().data_ptr()) {
      sums_.fp32[g].copy_(groups_[g]->flat_grad());
    }
    f.handle = comm_of(g)->all_reduce_sum(sums_.fp32[g], wire);
  } else if (!options_.stage.shards_gradients() && !lands(g)) {
    f.handle = comm_of(g)->reduce_scatter_sum(groups_[g]->flat_grad(), sums_.fp32[g], wire);
  } else {
    // Reduced where the gradients are (a landing brings it to a host accumulator).
    f.received =
        at::empty(sums_.fp32[g].sizes(), groups_[g]->flat_grad().options().dtype(at::kFloat));
    reductions_.received_bytes.resize(reductions_.received_bytes.bytes() + f.received.numel() * 4);
    f.handle = comm_of(g)->reduce_scatter_sum(groups_[g]->flat_grad(), f.received, wire);
  }
  reductions_.in_flight.push_back(std::move(f));
}

void GradReducer::wait_issuing_gathers(const CommHandle& handle) {
  // NCCL: waiting holds back the compute stream, never this thread, so no peer can be
  // stuck behind it; polling would only make the host wait for the device.
  if (handle.stream_ordered()) return;
  constexpr auto kPatience = std::chrono::milliseconds(20);
  auto since = std::chrono::steady_clock::now();
  while (hooks_.advance && !handle.ready()) {
    if (std::chrono::steady_clock::now() - since < kPatience) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (!hooks_.advance()) return;  // nothing left to issue: a plain wait cannot block a peer
    since = std::chrono::steady_clock::now();
  }
}

void GradReducer::retire_oldest() {
  InFlight f = std::move(reductions_.in_flight.front());
  reductions_.in_flight.erase(reductions_.in_flight.begin());
  f.handle.wait();
  if (options_.stage.shards_gradients()) groups_[f.group]->release_grads();  // in f.received
  if (!replicas_) {
    accumulate(f);
    return finished(f.group);
  }
  // Across groups: the shard's all-reduce (the slow link's share) runs while the next
  // group's reduce-scatter does; one is kept in flight.
  const CollectiveLabel label(fmt::format("gradients of group {}", f.group));
  f.handle = replicas_->all_reduce_sum(f.received.defined() ? f.received : sums_.fp32[f.group],
                                       options_.wire);
  reductions_.across.push_back(std::move(f));
  if (reductions_.across.size() > 1) finish_across();
}

void GradReducer::finish_across() {
  InFlight f = std::move(reductions_.across.front());
  reductions_.across.erase(reductions_.across.begin());
  wait_issuing_gathers(f.handle);
  f.handle.wait();
  accumulate(f);
  finished(f.group);
}

void GradReducer::accumulate(const InFlight& f) {
  if (!f.received.defined()) return;  // reduced into sums_.fp32 itself
  if (lands(f.group)) {
    reductions_.received_bytes.resize(reductions_.received_bytes.bytes() -
                                      f.received.numel() * 4);  // the landing's now
    // Stage 1 reduces once per window: its shard is the whole sum.
    landings_->land(f.group, f.received,
                    !options_.stage.shards_gradients() || sums_.clean[f.group]);
    sums_.clean[f.group] = false;
    return;
  }
  // 0 + x is x: the first micro-batch's shard is copied in (as a landing is).
  if (sums_.clean[f.group]) {
    sums_.fp32[f.group].copy_(f.received);
  } else {
    sums_.fp32[f.group].add_(f.received);
  }
  sums_.clean[f.group] = false;
  reductions_.received_bytes.resize(reductions_.received_bytes.bytes() - f.received.numel() * 4);
}

const at::Tensor& GradReducer::settled(size_t group) {
  if (lands(group)) landings_->settle(group);
  return sum(group);
}

const at::Tensor& GradReducer::sum(size_t group) {
  at::Tensor& s = sums_.fp32.at(group);
  if (sums_.stale[group]) {  // no backward since zero(): it must read as zeros
    s.zero_();
    sums_.stale[group] = 0;
  }
  return s;
}

const std::vector<at::Tensor>& GradReducer::sums() {
  for (size_t g = 0; g < sums_.fp32.size(); ++g) sum(g);
  return sums_.fp32;
}

void GradReducer::settle_all() {
  if (landings_) landings_->settle_all();
}

void GradReducer::finished(size_t group) {
  if (window_.boundary && hooks_.on_reduced) hooks_.on_reduced(group);
}

void GradReducer::drain() {
  while (!reductions_.in_flight.empty()) retire_oldest();
  while (!reductions_.across.empty()) finish_across();
}

void GradReducer::end_backward() {
  if (!window_.reducing) return;
  // Whatever did not arrive (unused parameters) counts as zero: launch the rest.
  while (window_.next >= 0) launch(window_.next--);
  if (options_.stage.shards_gradients()) drain();
  settle_all();
}

const std::vector<at::Tensor>& GradReducer::reduced() {
  drain();
  settle_all();
  return sums();
}

// Both passes below leave their per-buffer results where the gradients are and read one
// number at the end: on a GPU one wait for the device per step, not one per buffer.
double GradReducer::global_norm(double scale) {
  // One fp32 pass per buffer (no double copy of the gradients); squares summed in double.
  settle_all();
  if (sums_.fp32.empty()) return 0;
  std::vector<at::Tensor> norms;
  const at::Device where = sums_.fp32.front().device();  // (all in one place, as a rule)
  const std::vector<at::Tensor>& all = sums();
  for (size_t g = 0; g < all.size(); ++g)
    norms.push_back(all[g].norm().to(where) * std::sqrt(square_weight(g)));
  const at::Tensor squares = at::stack(norms).to(at::kDouble).square().sum().reshape({1});
  return norm_across_ranks(squares - squares_counted_elsewhere(where), scale);
}

double GradReducer::global_norm_of(double sum_squares, double scale) {
  if (sums_.fp32.empty()) return 0;
  const at::Device where = sums_.fp32.front().device();
  const at::Tensor squares = at::full({1}, sum_squares, at::dtype(at::kDouble).device(where));
  return norm_across_ranks(squares - squares_counted_elsewhere(where), scale);
}

at::Tensor GradReducer::squares_counted_elsewhere(const at::Device& where) {
  at::Tensor total = at::zeros({1}, at::dtype(at::kDouble).device(where));
  const auto& ranges = options_.counted_on_another_tp_rank;
  for (size_t g = 0; g < ranges.size(); ++g) {
    for (const auto& [begin, count] : ranges[g])
      total += sum(g).narrow(0, begin, count).to(at::kDouble).square().sum().to(where);
  }
  return total;
}

void GradReducer::set_experts(Collectives* experts, std::vector<bool> is_expert) {
  experts_ = experts;
  is_expert_ = std::move(is_expert);
  is_expert_.resize(groups_.size(), false);
}

double GradReducer::square_weight(size_t group) const {
  if (sharded_grads() || !experts_) return 1.0;
  return 1.0 / (is_expert_[group] ? experts_->world() : comm_->world());
}

double GradReducer::norm_across_ranks(at::Tensor sum_squares, double scale) {
  // Stage 0 holds identical full gradients on every rank; the shards need a sum.
  const CollectiveLabel label("the gradient norm");
  if (summed_across_ranks()) comm_->all_reduce_sum(sum_squares).wait();
  if (tensor_parallel_) tensor_parallel_->all_reduce_sum(sum_squares).wait();
  if (pipeline_parallel_) pipeline_parallel_->all_reduce_sum(sum_squares).wait();
  const double squares = sum_squares.item<double>();
  // A NaN stays one (std::max would make it 0), so a window's non-finite gradients show.
  if (std::isnan(squares)) return squares;
  return std::sqrt(std::max(0.0, squares)) * std::abs(scale);
}

bool GradReducer::any_overflow() {
  settle_all();
  if (sums_.fp32.empty()) return false;
  std::vector<at::Tensor> finite;
  const at::Device where = sums_.fp32.front().device();
  for (const auto& g : sums()) finite.push_back(at::isfinite(g).all().to(where));
  at::Tensor bad = at::logical_not(at::stack(finite)).any().to(at::kFloat).reshape({1});
  const CollectiveLabel label("the overflow check");
  if (summed_across_ranks()) comm_->all_reduce_sum(bad).wait();
  if (tensor_parallel_) tensor_parallel_->all_reduce_sum(bad).wait();
  if (pipeline_parallel_) pipeline_parallel_->all_reduce_sum(bad).wait();
  return bad.item<float>() > 0;
}

void GradReducer::zero() {
  settle_all();  // no copy may still be writing into an accumulator
  sums_.clean.assign(groups_.size(), true);
  for (size_t i = 0; i < groups_.size(); ++i) {
    groups_[i]->zero_grads();
    // fp32 at stages 0-1 reduces in the gradient buffer itself: already zeroed above.
    if (!sums_.fp32[i].is_alias_of(groups_[i]->flat_grad())) sums_.stale[i] = 1;
  }
}

}  // namespace zeroshard
