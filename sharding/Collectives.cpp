#include "sharding/Collectives.h"

#include <map>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "common/Error.h"
#include "common/Hash.h"
#include "common/InterpreterLock.h"
#include "sharding/StoreNotes.h"

namespace zeroshard {
namespace {

thread_local std::string current_label;

const char* op_name(int64_t op) {
  switch (op) {
    case 1:
      return "all-reduce";
    case 2:
      return "all-gather";
    case 3:
      return "reduce-scatter";
    case 4:
      return "broadcast";
    default:
      return "collective";
  }
}

// Gloo moves bytes for all-gather, alltoall and broadcast without looking at them, so
// a bf16 payload travels as fp16 bit for bit: one 16-bit type on the wire.
at::Tensor as_payload(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace

CollectiveLabel::CollectiveLabel(std::string label) : previous_(std::move(current_label)) {
  current_label = std::move(label);
}

CollectiveLabel::~CollectiveLabel() {
  current_label = std::move(previous_);
}

const std::string& CollectiveLabel::current() {
  return current_label;
}

CommHandle::CommHandle(const Collectives* owner, CollectiveCall call,
                       c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish,
                       LedgerEntry scratch)
    : owner_(owner),
      call_(std::move(call)),
      work_(std::move(work)),
      finish_(std::move(finish)),
      scratch_(std::move(scratch)) {}

void CommHandle::wait() {
  if (owner_ == nullptr) return;
  const Collectives* owner = std::exchange(owner_, nullptr);
  if (work_) {
    owner->refuse_under_interpreter_lock(call_, "waited on");
    std::optional<CollectiveWatch::Waiting> waiting;
    if (owner->options_.watch != nullptr) waiting.emplace(owner->options_.watch, call_);
    try {
      work_->wait();
    } catch (const std::exception& e) {
      owner->fail_collective(call_, e.what());
    }
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
                         std::function<std::string()> diagnose, MemoryLedger* ledger,
                         CollectiveOptions options)
    : group_(std::move(group)),
      rank_(rank),
      world_(world),
      diagnose_(std::move(diagnose)),
      ledger_(ledger),
      options_(std::move(options)) {
  if (group_) nccl_ = group_->getBackendName() == "nccl";
}

void Collectives::count(const at::Tensor& buffer, int64_t times) {
  bytes_sent_ += times * bytes_of(buffer) * (world_ - 1) / world_;
}

// Only NCCL takes the flat ops: on Gloo they measured slower (see Collectives.h).
bool Collectives::native_flat() const {
  return nccl_;
}

void Collectives::fail_collective(const CollectiveCall& call, const std::string& what) const {
  // What the others wait on first: the roll-call keeps rank 0, which may serve the store,
  // until every rank has answered it.
  const std::string others = options_.watch ? options_.watch->report(call) : "";
  const std::string missing = diagnose_ ? diagnose_() : "";
  fail("rank {}: {} failed: {}{}{}{}{}", rank_, call.describe(), without_backtrace(what),
       missing.empty() ? "" : "; ", missing, others.empty() ? "" : "; ", others);
}

void Collectives::refuse_under_interpreter_lock(const CollectiveCall& call,
                                                const char* doing) const {
  if (!options_.check || !interpreter_lock_held()) return;
  fail(
      "rank {}: {} was {} while this thread held Python's GIL; a collective whose tensors "
      "Python owns then deadlocks (common/InterpreterLock.h): the binding that called it must "
      "release the GIL",
      rank_, call.describe(), doing);
}

CollectiveCall Collectives::next_call(Op op, const at::Tensor& tensor,
                                      std::optional<at::ScalarType> wire, int root) {
  CollectiveCall call;
  call.group = options_.name;
  call.seq = ++seq_;
  const std::string& label = CollectiveLabel::current();
  call.what = fmt::format("{} of {} {}{}{}{}", op_name(static_cast<int64_t>(op)), tensor.numel(),
                          c10::toString(tensor.scalar_type()),
                          wire ? fmt::format(" in {}", c10::toString(*wire)) : "",
                          op == Op::Broadcast ? fmt::format(" from rank {}", root) : "",
                          label.empty() ? "" : fmt::format(" ({})", label));
  refuse_under_interpreter_lock(call, "issued");
  if (options_.check) {
    agree_on(call,
             {call.seq, static_cast<int64_t>(op), tensor.numel(),
              static_cast<int64_t>(tensor.scalar_type()), wire ? static_cast<int64_t>(*wire) : -1,
              root, static_cast<int64_t>(fnv1a(label))});
  }
  return call;
}

// One small all-gather over the same group before the collective itself: every rank sees
// every rank's fingerprint, so all of them find a mismatch at once.
void Collectives::agree_on(const CollectiveCall& call, const std::vector<int64_t>& fingerprint) {
  const auto n = static_cast<int64_t>(fingerprint.size());
  at::Tensor mine = at::tensor(fingerprint, at::kLong);
  at::Tensor all = at::empty({world_ * n}, at::kLong);
  OnWire in = on_wire(mine), out = on_wire(all);
  c10::intrusive_ptr<c10d::Work> work;
  if (native_flat()) {
    work = group_->_allgather_base(out.tensor, in.tensor);
  } else {
    std::vector<std::vector<at::Tensor>> outputs{out.tensor.chunk(world_)};
    std::vector<at::Tensor> inputs{in.tensor};
    work = group_->allgather(outputs, inputs);
  }
  CollectiveCall agreeing = call;
  agreeing.what = "the fingerprint of " + call.what;
  CommHandle(this, agreeing, work, out.back, LedgerEntry()).wait();
  const at::Tensor rows = all.view({world_, n});
  if (!rows.eq(rows[0]).all().item<bool>()) fail_diverged(call);
}

// Each rank tells the others its own description through the store, then every rank fails
// with all of them.
void Collectives::fail_diverged(const CollectiveCall& call) const {
  const std::string key = fmt::format("diverged/{}/{}/", options_.name, call.seq);
  std::map<std::string, std::vector<int>> by_call;
  std::string unread;  // why the others' collectives are not known
  if (options_.store) {
    try {
      c10d::Store& store = *options_.store;
      write_note(store, key + std::to_string(rank_), call.what);
      for (int r = 0; r < world_; ++r)
        by_call[read_note(store, key + std::to_string(r))].push_back(r);
    } catch (const std::exception& e) {
      by_call.clear();
      unread = without_backtrace(e.what());
    }
    try {
      // Every rank stays until the group has read: the one serving the store may be here.
      // What this rank has read stands even if the store is gone by now.
      if (unread.empty()) done_reading(*options_.store, key + "read", world_, /*stay=*/true);
    } catch (const std::exception&) {
    }
  }
  if (by_call.empty()) by_call[call.what].push_back(rank_);
  std::string calls;
  for (const auto& [what, ranks] : by_call)
    calls +=
        fmt::format("{}rank(s) {}: {}", calls.empty() ? "" : "; ", describe_ranks(ranks), what);
  if (!unread.empty()) calls += "; the other ranks' could not be read from the store: " + unread;
  fail(
      "rank {}: collectives diverged: the ranks of group '{}' issued different collectives as "
      "its #{} ({}); every rank must issue the same collectives in the same order, so the "
      "program took a different path on some rank (docs/reliability.md)",
      rank_, options_.name, call.seq, calls);
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
  std::lock_guard<std::mutex> order(order_);
  CollectiveCall call = next_call(Op::AllReduce, tensor, wire, -1);
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
  return {this, std::move(call), work, back, std::move(scratch)};
}

CommHandle Collectives::all_gather(const at::Tensor& flat) {
  if (!group_) return {};
  std::lock_guard<std::mutex> order(order_);
  CollectiveCall call = next_call(Op::AllGather, flat, std::nullopt, -1);
  OnWire w = on_wire(flat);
  at::Tensor payload = as_payload(w.tensor);
  count(payload, 1);
  if (native_flat()) {
    at::Tensor input = payload.chunk(world_)[rank_];
    auto work = group_->_allgather_base(payload, input);
    return {this, std::move(call), work, w.back, LedgerEntry()};
  }
  std::vector<std::vector<at::Tensor>> outputs{payload.chunk(world_)};
  std::vector<at::Tensor> inputs{outputs[0][rank_]};
  auto work = group_->allgather(outputs, inputs);
  return {this, std::move(call), work, w.back, LedgerEntry()};
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
  std::lock_guard<std::mutex> order(order_);
  CollectiveCall call = next_call(Op::ReduceScatter, flat_in, wire, -1);
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
    return {this, std::move(call), work, finish, std::move(scratch)};
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
  return {this, std::move(call), work, finish, std::move(scratch)};
}

CommHandle Collectives::broadcast(const at::Tensor& tensor, int root) {
  if (!group_) return {};
  std::lock_guard<std::mutex> order(order_);
  CollectiveCall call = next_call(Op::Broadcast, tensor, std::nullopt, root);
  OnWire w = on_wire(tensor);
  std::vector<at::Tensor> tensors{as_payload(w.tensor)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  auto work = group_->broadcast(tensors, opts);
  return {this, std::move(call), work, w.back, LedgerEntry()};
}

}  // namespace zeroshard
