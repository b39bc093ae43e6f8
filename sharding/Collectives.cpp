#include "sharding/Collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "common/Error.h"

namespace zeroshard {
namespace {

// Gloo moves bytes for all-gather, alltoall and broadcast without looking at them, so
// a bf16 payload travels as fp16 bit for bit: one 16-bit type on the wire.
at::Tensor as_payload(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace

CommHandle::CommHandle(const Collectives* owner, std::string op,
                       c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish,
                       LedgerEntry scratch)
    : owner_(owner),
      op_(std::move(op)),
      work_(std::move(work)),
      finish_(std::move(finish)),
      scratch_(std::move(scratch)) {}

void CommHandle::wait() {
  if (owner_ == nullptr) return;
  const Collectives* owner = std::exchange(owner_, nullptr);
  try {
    if (work_) work_->wait();
  } catch (const std::exception& e) {
    owner->fail_collective(op_, e.what());
  }
  if (finish_) finish_();
  work_.reset();
  scratch_ = LedgerEntry();
}

bool CommHandle::ready() const {
  return owner_ == nullptr || !work_ || work_->isCompleted();
}

bool CommHandle::stream_ordered() const {
  return owner_ != nullptr && owner_->nccl();
}

Collectives::Collectives(c10::intrusive_ptr<c10d::Backend> group, int rank, int world,
                         std::function<std::string()> diagnose, MemoryLedger* ledger)
    : group_(std::move(group)),
      rank_(rank),
      world_(world),
      diagnose_(std::move(diagnose)),
      ledger_(ledger) {
  if (group_) nccl_ = group_->getBackendName() == "nccl";
}

void Collectives::count(const at::Tensor& buffer, int64_t times) {
  bytes_sent_ += times * bytes_of(buffer) * (world_ - 1) / world_;
}

// Only NCCL takes the flat ops: on Gloo they measured slower (see Collectives.h).
bool Collectives::native_flat() const {
  return nccl_;
}

void Collectives::fail_collective(const std::string& op, const std::string& what) const {
  const std::string missing = diagnose_ ? diagnose_() : "";
  fail("rank {}: {} failed: {}{}{}", rank_, op, what, missing.empty() ? "" : "; ", missing);
}

// NCCL moves CUDA tensors only. A host tensor (a norm, a flag, a schedule, a
// checkpoint's file table) travels as a copy on the current CUDA device, written back
// when the op is waited on.
Collectives::OnWire Collectives::on_wire(const at::Tensor& tensor) const {
  if (!nccl_ || !tensor.is_cpu()) return {tensor, nullptr};
  at::Tensor wire = tensor.to(at::Device(at::kCUDA));
  return {wire, [tensor, wire] { tensor.copy_(wire); }};
}

CommHandle Collectives::all_reduce_sum(const at::Tensor& tensor,
                                       std::optional<at::ScalarType> wire) {
  // In another dtype a cast copy travels, and its sum is copied back when waited on.
  const bool cast = wire && *wire != tensor.scalar_type();
  if (!group_ && !cast) return {};
  const at::Tensor sent = cast ? tensor.to(*wire) : tensor;
  LedgerEntry scratch(ledger_, Tier::Device, Kind::CommBuckets, cast ? bytes_of(sent) : 0);
  if (!group_) {
    tensor.copy_(sent);  // one rank: the same rounding as any other world size
    return {};
  }
  OnWire w = on_wire(sent);
  count(w.tensor, 2);
  std::vector<at::Tensor> tensors{w.tensor};
  auto work = group_->allreduce(tensors);
  std::function<void()> back = w.back;
  if (cast) {
    back = [back, tensor, sent] {
      if (back) back();
      tensor.copy_(sent);
    };
  }
  return {this, "all-reduce", work, back, std::move(scratch)};
}

CommHandle Collectives::all_gather(const at::Tensor& flat) {
  if (!group_) return {};
  OnWire w = on_wire(flat);
  at::Tensor payload = as_payload(w.tensor);
  count(payload, 1);
  if (native_flat()) {
    at::Tensor input = payload.chunk(world_)[rank_];
    auto work = group_->_allgather_base(payload, input);
    return {this, "all-gather", work, w.back, LedgerEntry()};
  }
  std::vector<std::vector<at::Tensor>> outputs{payload.chunk(world_)};
  std::vector<at::Tensor> inputs{outputs[0][rank_]};
  auto work = group_->allgather(outputs, inputs);
  return {this, "all-gather", work, w.back, LedgerEntry()};
}

CommHandle Collectives::reduce_scatter_sum(const at::Tensor& flat_in, const at::Tensor& shard_out,
                                           std::optional<at::ScalarType> wire) {
  const bool cast = wire && *wire != flat_in.scalar_type();
  const at::Tensor in = cast ? flat_in.to(*wire) : flat_in;
  LedgerEntry scratch(ledger_, Tier::Device, Kind::CommBuckets, cast ? bytes_of(in) : 0);
  if (!group_) {
    shard_out.copy_(in);
    return {};
  }
  const int64_t shard = in.numel() / world_;
  count(in, 1);
  if (native_flat() && in.device() == shard_out.device() &&
      (wire || in.scalar_type() == shard_out.scalar_type())) {
    const bool same = in.scalar_type() == shard_out.scalar_type();
    at::Tensor out = same ? shard_out : at::empty({shard}, in.options());
    if (!same) scratch.resize(scratch.bytes() + bytes_of(out));
    at::Tensor input = in;
    auto work = group_->_reduce_scatter_base(out, input);
    // The cast input lives until the op is waited on; a cast output is copied back then.
    auto finish = [in, out, shard_out, same] {
      if (!same) shard_out.copy_(out);
    };
    return {this, "reduce-scatter", work, finish, std::move(scratch)};
  }
  // alltoall: chunk j of the output is rank j's chunk `rank`; summed here, in the wire
  // dtype when one is named, else in fp32.
  at::Tensor received = at::empty_like(in);
  scratch.resize(scratch.bytes() + bytes_of(received));
  at::Tensor out_payload = as_payload(received);
  at::Tensor in_payload = as_payload(in);
  std::vector<int64_t> even;
  auto work = group_->alltoall_base(out_payload, in_payload, even, even);
  auto finish = [in, received, shard_out, shard, world = world_, in_wire = wire.has_value()] {
    const at::Tensor rows = received.view({world, shard});
    shard_out.copy_(in_wire ? rows.sum(0) : rows.to(at::kFloat).sum(0));
  };
  return {this, "reduce-scatter", work, finish, std::move(scratch)};
}

CommHandle Collectives::broadcast(const at::Tensor& tensor, int root) {
  if (!group_) return {};
  OnWire w = on_wire(tensor);
  std::vector<at::Tensor> tensors{as_payload(w.tensor)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  auto work = group_->broadcast(tensors, opts);
  return {this, "broadcast", work, w.back, LedgerEntry()};
}

}  // namespace zeroshard
