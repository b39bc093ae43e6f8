#include "sharding/FlatParamGroup.h"

#include <limits>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "common/Alignment.h"
#include "common/Error.h"
#include "sharding/PageAllocator.h"

namespace zeroshard {
namespace {

int64_t nbytes(int64_t numel, const at::Tensor& like) {
  return numel * static_cast<int64_t>(like.element_size());
}

std::vector<TensorExtent> extents_of(const std::vector<NamedParam>& params, bool quantized) {
  std::vector<TensorExtent> out;
  int64_t offset = 0;
  for (const auto& p : params) {
    out.push_back({offset, p.param.numel(), quantized && p.quantizable});
    offset += p.param.numel();
  }
  return out;
}

int64_t total_numel(const std::vector<NamedParam>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.param.numel();
  return n;
}

}  // namespace

FlatParamGroup::FlatParamGroup(const std::vector<NamedParam>& params, int rank, int world,
                               at::ScalarType dtype, bool sharded, bool with_grads, bool lazy_grads,
                               MemoryLedger* ledger, const ShardQuantizer* quantizer)
    : rank_(rank), world_(world), sharded_(sharded), with_grads_(with_grads) {
  if (quantizer != nullptr && with_grads_) fail("a group with gradients cannot be quantized");
  for (const auto& p : params) {
    ParamSlot slot;
    slot.name = p.name;
    slot.param = p.param;
    slot.shape = p.param.sizes().vec();
    slot.offset = numel_;
    slot.numel = p.param.numel();
    numel_ += slot.numel;
    if (p.quantizable) quantizable_numel_ += slot.numel;
    slots_.push_back(std::move(slot));
  }
  shard_numel_ = padded_shard_numel(numel_, world_);
  const auto options = params.front().param.options().dtype(dtype).requires_grad(false);
  // A unit's full buffer comes and goes with every gather: on a CPU device in pages that
  // leave the process when it goes (sharding/PageAllocator.h).
  const at::Tensor flat = sharded_ && options.device().is_cpu()
                              ? page_backed_zeros(padded_numel(), options)
                              : at::zeros({padded_numel()}, options);
  {
    at::NoGradGuard no_grad;
    for (const auto& s : slots_) flat.narrow(0, s.offset, s.numel).copy_(s.param.reshape(-1));
  }
  const Tier tier = Tier::Device;
  const int64_t full_bytes = nbytes(padded_numel(), flat);
  flat_ =
      CountedBuffer(flat, ledger, tier, sharded_ ? Kind::GatheredParams : Kind::Params, full_bytes);
  const std::vector<TensorExtent> extents = extents_of(params, quantizer != nullptr);
  if (quantizer != nullptr && !sharded_) {  // whole: the weights as their codes decode
    whole_quantizer_ = quantizer;
    extents_ = extents;
    requantize_whole();
  } else if (quantizer != nullptr) {
    quantizer_ = quantizer;
    segments_ = ShardQuantizer::segments(extents, rank_ * shard_numel_, shard_numel_);
    const at::Tensor bytes = quantizer->encode(flat, segments_);
    kept_bytes_ = bytes.numel();
    kept_.buffer = CountedBuffer(bytes, ledger, tier, Kind::Params, kept_bytes_);
  } else if (sharded_) {
    kept_bytes_ = nbytes(shard_numel_, flat);
    kept_.buffer = CountedBuffer(own_slice().clone(), ledger, tier, Kind::Params, kept_bytes_);
  }
  if (with_grads_) {
    // Lazy: views need the full size once; at::empty touches no page before it is released.
    grad_ = CountedBuffer(
        lazy_grads ? at::empty({padded_numel()}, options) : at::zeros({padded_numel()}, options),
        ledger, tier, Kind::Grads, lazy_grads ? 0 : full_bytes);
  }
  bind_views();
  if (with_grads_ && lazy_grads) grad_.resize(0);
  if (sharded_) release_full();
}

void FlatParamGroup::bind_views() {
  for (auto& s : slots_) {
    bind_param(s);
    if (with_grads_ && s.param.requires_grad()) {
      s.param.mutable_grad() = grad_.tensor().narrow(0, s.offset, s.numel).view(s.shape);
    }
  }
}

void FlatParamGroup::bind_param(ParamSlot& s) {
  at::NoGradGuard no_grad;
  s.param.set_data(flat_.tensor().narrow(0, s.offset, s.numel).view(s.shape));
}

// A released parameter must not point into storage that is gone (reading it would
// crash): it becomes one NaN spread over its shape, so a read outside a gather shows
// up as NaN and a write fails in torch ("more than one element ... refers to a single
// memory location"), and both leave the flat buffer alone.
void FlatParamGroup::poison_params() {
  at::NoGradGuard no_grad;
  if (!poison_.defined()) {
    poison_ = at::full({1}, std::numeric_limits<double>::quiet_NaN(), flat_.tensor().options());
  }
  for (auto& s : slots_) s.param.set_data(poison_.expand(s.shape));
}

at::Tensor FlatParamGroup::param_shard() const {
  return sharded_ ? kept_.buffer.tensor() : own_slice();
}

at::Tensor FlatParamGroup::grad_shard() const {
  return grad_.tensor().narrow(0, rank_ * shard_numel_, shard_numel_);
}

void FlatParamGroup::release_grads() {
  if (with_grads_) grad_.resize(0);
}

void FlatParamGroup::materialize_grads() {
  if (!with_grads_ || grad_.resident()) return;
  grad_.resize(nbytes(padded_numel(), grad_.tensor()));
  grad_.tensor().zero_();
}

void FlatParamGroup::keep_grad_view(size_t slot) {
  ParamSlot& s = slots_.at(slot);
  const at::Tensor& grad = s.param.grad();
  const at::Tensor& flat_grad = grad_.tensor();
  const auto* view_start =
      static_cast<const char*>(flat_grad.data_ptr()) + s.offset * flat_grad.element_size();
  if (grad.defined() && grad.data_ptr() == view_start) return;
  s.param.mutable_grad() = flat_grad.narrow(0, s.offset, s.numel).view(s.shape);
}

void FlatParamGroup::zero_grads() {
  if (with_grads_ && grad_.resident()) grad_.tensor().zero_();
}

void FlatParamGroup::allocate_full(bool fill_own_shard) {
  if (gathered_) return;
  flat_.resize(nbytes(padded_numel(), flat_.tensor()));
  if (fill_own_shard) {
    const at::Tensor& kept = kept_.buffer.tensor();
    if (quantizer_ != nullptr) {
      quantizer_->decode(kept, segments_, own_slice());
    } else if (kept.is_cpu() && !flat_.tensor().is_cpu()) {  // host to GPU: the host does not wait
      kept_.read = CopyStream::on_current(own_slice(), kept);
    } else {
      own_slice().copy_(kept);
    }
  }
  for (auto& s : slots_) bind_param(s);
  gathered_ = true;
}

void FlatParamGroup::release_shard() {
  kept_.buffer.resize(0);
}

void FlatParamGroup::materialize_shard() {
  if (shard_resident()) return;
  kept_.buffer.resize(kept_bytes_);
}

void FlatParamGroup::keep_own_slice() {
  if (quantizer_ != nullptr) {
    kept_.buffer.tensor().copy_(quantizer_->encode(flat_.tensor(), segments_));
  } else {
    kept_.buffer.tensor().copy_(own_slice());
  }
}

void FlatParamGroup::requantize_whole() {
  if (whole_quantizer_ == nullptr) return;
  at::NoGradGuard no_grad;
  const at::Tensor& flat = flat_.tensor();
  const auto all = ShardQuantizer::segments(extents_, 0, padded_numel());
  whole_quantizer_->decode(whole_quantizer_->encode(flat, all), all, flat);
}

int64_t FlatParamGroup::kept_bytes_of(const std::vector<NamedParam>& params, int rank, int world,
                                      at::ScalarType dtype, const ShardQuantizer* quantizer) {
  const int64_t shard = padded_shard_numel(total_numel(params), world);
  const auto element = static_cast<int64_t>(c10::elementSize(dtype));
  if (quantizer == nullptr) return shard * element;
  return quantizer->bytes(ShardQuantizer::segments(extents_of(params, true), rank * shard, shard),
                          element);
}

void FlatParamGroup::decode_kept(const at::Tensor& kept_bytes, const at::Tensor& slice) const {
  if (quantizer_ == nullptr) fail("decode_kept: the group's shard is not quantized");
  quantizer_->decode(kept_bytes, segments_, slice);
}

void FlatParamGroup::set_shard_tier(Tier tier, MemoryLedger* ledger) {
  kept_.buffer.recount(ledger, tier, Kind::Params);
}

void FlatParamGroup::keep_shard_on_host(MemoryLedger* ledger) {
  const at::Tensor& shard = kept_.buffer.tensor();
  if (!sharded_ || shard.device().is_cpu()) return;
  kept_.buffer = CountedBuffer(shard.to(shard.options().device(at::kCPU).pinned_memory(true),
                                        /*non_blocking=*/false, /*copy=*/true),
                               ledger, Tier::Host, Kind::Params, kept_.buffer.bytes());
}

void FlatParamGroup::release_full() {
  if (!gathered_) return;
  poison_params();
  flat_.resize(0);
  gathered_ = false;
}

}  // namespace zeroshard
