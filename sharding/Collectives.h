#pragma once
// Asynchronous all-reduce, all-gather and reduce-scatter over a c10d process group, on
// a path chosen up front from the backend:
//   Gloo: all-gather through the list form into views of the flat buffer;
//   reduce-scatter through alltoall_base plus a local sum in fp32. Gloo has the flat
//   ops, but they measured slower (LibTorch 2.6, GPT bench, 2 ranks: stage-3 step
//   0.23 s flat vs 0.16 s list/alltoall).
//   NCCL: the native flat ops.
// A gradient reduction may name its `wire` dtype (DeepSpeed's communication_data_type):
// the values are cast to it, travel in it and are summed in it, and the result is cast
// back. Without one they travel in their own dtype and are summed in fp32 (a bf16 or
// fp16 gradient then takes the alltoall path on NCCL too: its reduce-scatter would sum
// in 16 bits).
//
// Every collective is numbered in its group's order and described (op, size, dtype, and
// the label its caller set with CollectiveLabel): a failure names it, and the
// CollectiveWatch says what the other ranks wait on. With `check` (check_collectives, or
// ZS_CHECK_COLLECTIVES=1) the ranks first agree on that fingerprint in a small all-gather
// over the same group, and a mismatch fails on every rank with each rank's collective,
// before the mismatched one runs (docs/reliability.md).
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/MemoryLedger.h"
#include "sharding/CollectiveWatch.h"

namespace zeroshard {

class Collectives;

// What the collectives this thread issues while it lives are for, in their descriptions and
// fingerprints ("unit 3", "gradients of group 5"). Every rank must set the same label for
// the same collective; nested labels replace the outer one.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;
  static const std::string& current();

 private:
  std::string previous_;
};

struct CollectiveOptions {
  std::string name = "group";  // in messages: world, shards, params, touches, ...
  // The engine's store: a mismatch found by `check` is described through it. May be null.
  c10::intrusive_ptr<c10d::Store> store;
  CollectiveWatch* watch = nullptr;  // what this rank waits on, told to the others
  bool check = false;                // agree on each collective's fingerprint first
};

// One collective in flight. wait() completes it (and any local finishing work, such
// as the sum after alltoall); a failure becomes an Error naming the op and the ranks
// that stopped answering.
class CommHandle {
 public:
  CommHandle() = default;
  CommHandle(const Collectives* owner, CollectiveCall call, c10::intrusive_ptr<c10d::Work> work,
             std::function<void()> finish, LedgerEntry scratch);
  void wait();
  // Done on the wire (wait() will not block), without waiting.
  bool ready() const;
  // An NCCL collective: wait() makes the current stream wait, not the host.
  bool stream_ordered() const;

 private:
  const Collectives* owner_ = nullptr;
  CollectiveCall call_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  LedgerEntry scratch_;  // temporary buffers counted as communication buckets
};

class Collectives {
 public:
  // `group` may be null for one process (every op is then a no-op); `diagnose` explains
  // a failure. Host tensors may be passed to an NCCL group: they travel as device copies.
  Collectives(c10::intrusive_ptr<c10d::Backend> group, int rank, int world,
              std::function<std::string()> diagnose, MemoryLedger* ledger,
              CollectiveOptions options = {});

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Sum over ranks, in place; in `wire` when given (see above).
  CommHandle all_reduce_sum(const at::Tensor& tensor,
                            std::optional<at::ScalarType> wire = std::nullopt);
  // `flat` holds world equal chunks; chunk `rank` is this rank's input. In place.
  CommHandle all_gather(const at::Tensor& flat);
  // shard_out (any float dtype) = sum over ranks of chunk `rank` of their flat_in; in
  // `wire` when given (see above).
  CommHandle reduce_scatter_sum(const at::Tensor& flat_in, const at::Tensor& shard_out,
                                std::optional<at::ScalarType> wire = std::nullopt);
  CommHandle broadcast(const at::Tensor& tensor, int root);

  [[noreturn]] void fail_collective(const CollectiveCall& call, const std::string& what) const;
  bool nccl() const { return nccl_; }
  const std::string& name() const { return options_.name; }
  // Collectives issued so far on this group.
  int64_t issued() const { return seq_; }

  // Bytes this rank has sent, counted as bandwidth-optimal (ring) algorithms send them:
  // all-reduce 2(d-1)/d of the buffer, all-gather and reduce-scatter (d-1)/d.
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct OnWire {
    at::Tensor tensor;           // what the backend moves
    std::function<void()> back;  // writes it back to the caller's tensor, or null
  };
  friend class CommHandle;
  enum class Op : int64_t { AllReduce = 1, AllGather, ReduceScatter, Broadcast };
  // The next collective of this group (under order_): numbered, described and, with
  // `check`, agreed on by every rank of the group.
  CollectiveCall next_call(Op op, const at::Tensor& tensor, std::optional<at::ScalarType> wire,
                           int root);
  void agree_on(const CollectiveCall& call, const std::vector<int64_t>& fingerprint);
  [[noreturn]] void fail_diverged(const CollectiveCall& call) const;
  void refuse_under_interpreter_lock(const CollectiveCall& call, const char* doing) const;
  OnWire on_wire(const at::Tensor& tensor) const;
  bool native_flat() const;
  c10::intrusive_ptr<c10d::Backend> group_;
  int rank_;
  int world_;
  bool nccl_ = false;
  std::function<std::string()> diagnose_;
  MemoryLedger* ledger_;
  CollectiveOptions options_;
  // Held from numbering a collective to enqueueing it: its fingerprint and the collective
  // itself reach the group next to each other.
  std::mutex order_;
  int64_t seq_ = 0;
  int64_t bytes_sent_ = 0;
  void count(const at::Tensor& buffer, int64_t times);
};

}  // namespace zeroshard
