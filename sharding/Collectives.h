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
#include <functional>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "common/MemoryLedger.h"

namespace zeroshard {

class Collectives;

// One collective in flight. wait() completes it (and any local finishing work, such
// as the sum after alltoall); a failure becomes an Error naming the op and the ranks
// that stopped answering.
class CommHandle {
 public:
  CommHandle() = default;
  CommHandle(const Collectives* owner, std::string op, c10::intrusive_ptr<c10d::Work> work,
             std::function<void()> finish, LedgerEntry scratch);
  void wait();
  // Done on the wire (wait() will not block), without waiting.
  bool ready() const;
  // An NCCL collective: wait() makes the current stream wait, not the host.
  bool stream_ordered() const;

 private:
  const Collectives* owner_ = nullptr;
  std::string op_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  LedgerEntry scratch_;  // temporary buffers counted as communication buckets
};

class Collectives {
 public:
  // `group` may be null for one process (every op is then a no-op); `diagnose` explains
  // a failure. Host tensors may be passed to an NCCL group: they travel as device copies.
  Collectives(c10::intrusive_ptr<c10d::Backend> group, int rank, int world,
              std::function<std::string()> diagnose, MemoryLedger* ledger);

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

  [[noreturn]] void fail_collective(const std::string& op, const std::string& what) const;
  bool nccl() const { return nccl_; }

  // Bytes this rank has sent, counted as bandwidth-optimal (ring) algorithms send them:
  // all-reduce 2(d-1)/d of the buffer, all-gather and reduce-scatter (d-1)/d.
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct OnWire {
    at::Tensor tensor;           // what the backend moves
    std::function<void()> back;  // writes it back to the caller's tensor, or null
  };
  OnWire on_wire(const at::Tensor& tensor) const;
  bool native_flat() const;
  c10::intrusive_ptr<c10d::Backend> group_;
  int rank_;
  int world_;
  bool nccl_ = false;
  std::function<std::string()> diagnose_;
  MemoryLedger* ledger_;
  int64_t bytes_sent_ = 0;
  void count(const at::Tensor& buffer, int64_t times);
};

}  // namespace zeroshard
