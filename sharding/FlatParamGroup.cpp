#include "sharding/FlatParamGroup.h"

#include <limits>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "common/Alignment.h"
#include "common/Error.h"

namespace zeroshard {
namespace {

int64_t nbytes(int64_t numel, const at::Tensor& like) {
  return numel * static_cast<int64_t>(like.element_size());
}

// Gives a tensor's storage `bytes` of fresh memory from the allocator it was made with
// (its device's: host malloc, or CUDA's caching allocator), or none. Views, and tensors
// autograd saved, keep pointing at the storage and so see the new memory. The contents
// are not kept: every caller writes or zeroes all it brings back.
void resize_storage(const at::Tensor& t, int64_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (bytes > 0 && storage->allocator() == nullptr)
    fail("a flat buffer on {} has no allocator to bring its memory back", storage->device().str());
  at::DataPtr memory = bytes > 0 ? storage->allocator()->allocate(static_cast<size_t>(bytes))
                                 : at::DataPtr(nullptr, storage->device());
  storage->set_data_ptr_noswap(std::move(memory));
  storage->set_nbytes(static_cast<size_t>(bytes));
}

}  // namespace

FlatParamGroup::FlatParamGroup(const std::vector<NamedParam>& params, int rank, int world,
                               at::ScalarType dtype, bool sharded, bool with_grads, bool lazy_grads,
                               MemoryLedger* ledger)
    : rank_(rank), world_(world), sharded_(sharded), with_grads_(with_grads) {
  for (const auto& p : params) {
    ParamSlot slot;
    slot.name = p.name;
    slot.param = p.param;
    slot.shape = p.param.sizes().vec();
    slot.offset = numel_;
    slot.numel = p.param.numel();
    numel_ += slot.numel;
    slots_.push_back(std::move(slot));
  }
  shard_numel_ = padded_shard_numel(numel_, world_);
  const auto options = params.front().param.options().dtype(dtype).requires_grad(false);
  flat_ = at::zeros({padded_numel()}, options);
  {
    at::NoGradGuard no_grad;
    for (const auto& s : slots_) flat_.narrow(0, s.offset, s.numel).copy_(s.param.reshape(-1));
  }
  const Tier tier = Tier::Device;
  if (sharded_) {
    shard_ = flat_.narrow(0, rank_ * shard_numel_, shard_numel_).clone();
    shard_entry_ = LedgerEntry(ledger, tier, Kind::Params, nbytes(shard_numel_, flat_));
    flat_entry_ = LedgerEntry(ledger, tier, Kind::GatheredParams, nbytes(padded_numel(), flat_));
  } else {
    flat_entry_ = LedgerEntry(ledger, tier, Kind::Params, nbytes(padded_numel(), flat_));
  }
  if (with_grads_) {
    if (lazy_grads) {
      // Views need the full size once; at::empty touches no page before it is released.
      flat_grad_ = at::empty({padded_numel()}, options);
      grad_entry_ = LedgerEntry(ledger, tier, Kind::Grads, 0);
    } else {
      flat_grad_ = at::zeros({padded_numel()}, options);
      grad_entry_ = LedgerEntry(ledger, tier, Kind::Grads, nbytes(padded_numel(), flat_));
    }
  }
  bind_views();
  if (with_grads_ && lazy_grads) resize_storage(flat_grad_, 0);
  if (sharded_) release_full();
}

void FlatParamGroup::bind_views() {
  for (auto& s : slots_) {
    bind_param(s);
    if (with_grads_ && s.param.requires_grad()) {
      s.param.mutable_grad() = flat_grad_.narrow(0, s.offset, s.numel).view(s.shape);
    }
  }
}

void FlatParamGroup::bind_param(ParamSlot& s) {
  at::NoGradGuard no_grad;
  s.param.set_data(flat_.narrow(0, s.offset, s.numel).view(s.shape));
}

// A released parameter must not point into storage that is gone (reading it would
// crash): it becomes one NaN spread over its shape, so a read outside a gather shows
// up as NaN and a write fails in torch ("more than one element ... refers to a single
// memory location"), and both leave the flat buffer alone.
void FlatParamGroup::poison_params() {
  at::NoGradGuard no_grad;
  if (!poison_.defined()) {
    poison_ = at::full({1}, std::numeric_limits<double>::quiet_NaN(), flat_.options());
  }
  for (auto& s : slots_) s.param.set_data(poison_.expand(s.shape));
}

at::Tensor FlatParamGroup::param_shard() const {
  return sharded_ ? shard_ : flat_.narrow(0, rank_ * shard_numel_, shard_numel_);
}

at::Tensor FlatParamGroup::grad_shard() const {
  return flat_grad_.narrow(0, rank_ * shard_numel_, shard_numel_);
}

void FlatParamGroup::release_grads() {
  if (!with_grads_) return;
  resize_storage(flat_grad_, 0);
  grad_entry_.resize(0);
}

void FlatParamGroup::materialize_grads() {
  if (!with_grads_ || grad_entry_.bytes() > 0) return;
  const int64_t bytes = nbytes(padded_numel(), flat_grad_);
  resize_storage(flat_grad_, bytes);
  grad_entry_.resize(bytes);
  flat_grad_.zero_();
}

void FlatParamGroup::keep_grad_view(size_t slot) {
  ParamSlot& s = slots_.at(slot);
  const at::Tensor& grad = s.param.grad();
  const auto* view_start =
      static_cast<const char*>(flat_grad_.data_ptr()) + s.offset * flat_grad_.element_size();
  if (grad.defined() && grad.data_ptr() == view_start) return;
  s.param.mutable_grad() = flat_grad_.narrow(0, s.offset, s.numel).view(s.shape);
}

void FlatParamGroup::zero_grads() {
  if (with_grads_ && grad_entry_.bytes() > 0) flat_grad_.zero_();
}

void FlatParamGroup::allocate_full(bool fill_own_shard) {
  if (gathered_) return;
  const int64_t bytes = nbytes(padded_numel(), flat_);
  resize_storage(flat_, bytes);
  flat_entry_.resize(bytes);
  if (fill_own_shard) own_slice().copy_(shard_);
  for (auto& s : slots_) bind_param(s);
  gathered_ = true;
}

void FlatParamGroup::release_shard() {
  resize_storage(shard_, 0);
  shard_entry_.resize(0);
}

void FlatParamGroup::materialize_shard() {
  if (shard_resident()) return;
  const int64_t bytes = nbytes(shard_numel_, shard_);
  resize_storage(shard_, bytes);
  shard_entry_.resize(bytes);
}

void FlatParamGroup::set_shard_tier(Tier tier, MemoryLedger* ledger) {
  const int64_t bytes = shard_entry_.bytes();
  shard_entry_ = LedgerEntry(ledger, tier, Kind::Params, bytes);
}

void FlatParamGroup::keep_shard_on_host(MemoryLedger* ledger) {
  if (!sharded_ || shard_.device().is_cpu()) return;
  shard_ = shard_.to(shard_.options().device(at::kCPU).pinned_memory(true), /*non_blocking=*/false,
                     /*copy=*/true);
  set_shard_tier(Tier::Host, ledger);
}

void FlatParamGroup::release_full() {
  if (!gathered_) return;
  poison_params();
  resize_storage(flat_, 0);
  flat_entry_.resize(0);
  gathered_ = false;
}

}  // namespace zeroshard
