#pragma once
// Turns each rank's gradients into what its optimizer shard needs: the sum over ranks
// (and over accumulated micro-batches) in fp32.
//   stage 0: all-reduce of each group; the optimizer sees every element.
//   stage 1: gradients accumulate locally across micro-batches; the backward that ends
//            the accumulation window reduce-scatters each group into this rank's shard.
//   stage 2/3: every backward reduce-scatters each group into an fp32 shard
//            accumulator, and the group's full gradient buffer is given back as soon
//            as that lands; it is allocated again when its next gradient arrives.
// A group is launched from inside backward as soon as all its gradients are in
// (post-hooks on the AccumulateGrad nodes); overlap_comm allows two groups in flight,
// otherwise each is waited for before the next is launched. Groups are launched in one fixed order
// (last to first) on every rank, whatever order gradients arrive in; unused parameters count as
// zero at the end.
// With shard groups (mics_shard_size), `comm` is this rank's group and `replicas` the
// ranks holding the same shard in the other groups: each reduce-scattered shard is then
// all-reduced across them, so every copy of a shard sees the sum over all ranks.
// A reduction holds buffers while in flight (the alltoall's receive buffer, a cast copy,
// the reduced shard), so at stages 1-3, and at stage 0 when it casts, a backward keeps at
// most two in flight (one without overlap_comm), as the memory model counts them.
// `wire` (DeepSpeed's communication_data_type) is the dtype the gradients are reduced
// in (sharding/Collectives.h); unset, they are summed in fp32.
// An offloaded optimizer on a GPU (stage >= 1) gets each reduced shard on the host
// through a copy stream: the shard is reduced on the device, and its copy "lands" in the
// host accumulator while backward goes on (sharding/HostLandings.h). A landing is settled
// before the host reads the accumulator: settled(group) for one group, from any thread;
// every one by the end of backward.
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"
#include "common/ZeroStage.h"
#include "sharding/Collectives.h"
#include "sharding/FlatParamGroup.h"
#include "sharding/HostLandings.h"

namespace torch::autograd {
struct Node;
}

namespace zeroshard {

struct ReduceOptions {
  ZeroStage stage;
  bool overlap = false;  // overlap_comm
  // Per group, where the optimizer reads its reduced gradient (empty: every group on the
  // device); anywhere but the device it gets a buffer of its own (the host copy an
  // offloaded optimizer reads). offload_optimizer.ratio mixes the two.
  std::vector<Tier> fp32_tiers;
  std::optional<at::ScalarType> wire;
  // Tensor parallelism: per group, element ranges [begin, begin + count) of its reduced
  // gradient (the whole buffer at stage 0, this rank's shard otherwise) that hold
  // parameters every tp rank has whole. The norm counts them on tp coordinate 0 alone
  // (Megatron's rule), so the engine gives them to the other coordinates' reducers.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> counted_on_another_tp_rank;
};

class GradReducer {
 public:
  GradReducer(std::vector<FlatParamGroup*> groups, ReduceOptions options, Collectives* comm,
              Collectives* replicas, MemoryLedger* ledger);
  ~GradReducer();

  // Around each backward; `boundary` when this backward ends an accumulation window.
  void begin_backward(bool boundary);
  void end_backward();
  // At the accumulation boundary: per group, the fp32 gradient summed over ranks and
  // micro-batches (the whole buffer at stage 0, this rank's shard otherwise).
  const std::vector<at::Tensor>& reduced();
  // Tensor parallelism: the ranks splitting parameters with this one; the norm and the
  // overflow check are summed across them too (null without).
  void set_tensor_parallel(Collectives* tensor_parallel) { tensor_parallel_ = tensor_parallel; }
  // Pipeline parallelism: the same ranks' places in the other stages, whose gradients are of
  // other parameters; the norm and the overflow check are summed across them (null without).
  void set_pipeline_parallel(Collectives* stages) { pipeline_parallel_ = stages; }
  // Expert parallelism: per group, whether it holds expert parameters, and the ranks holding
  // the same experts (edp), over which those groups are reduced instead of `comm`. Every
  // rank's expert gradients are of other experts than its ep peers', so the norm and the
  // overflow check are summed over `comm` (every data-parallel rank) at stage 0 too.
  void set_experts(Collectives* experts, std::vector<bool> is_expert);
  // Stages 2-3: reduce once, in the backward that ends the window, with each group's whole
  // gradient buffer accumulating the micro-batches until then (as stage 1 does; FSDP's
  // reduction under torch's pipelining schedules), instead of a reduce-scatter per backward.
  void reduce_once_per_window() { once_per_window_ = true; }
  // Global L2 norm of the reduced gradients times `scale`, across all shards (and tp ranks,
  // each parameter that every tp rank holds whole counted once).
  double global_norm(double scale);
  // The same from this rank's squares, summed by what read the gradients anyway (CPU
  // Adam): no pass over them here.
  double global_norm_of(double sum_squares, double scale);
  // Whether any rank's reduced gradients hold inf or NaN (fp16 overflow).
  bool any_overflow();
  void zero();
  // Called from inside backward when a gradient of slot `slot` of a group arrives, before
  // it is accumulated.
  void on_gradient(std::function<void(size_t group, size_t slot)> callback) {
    hooks_.on_gradient = std::move(callback);
  }
  // Called from inside backward when every gradient of a group has been accumulated.
  void on_group_complete(std::function<void(size_t)> callback) {
    hooks_.on_complete = std::move(callback);
  }
  // Called, in the backward that ends an accumulation window, as soon as a group's
  // reduced gradient is final (settled(group) returns it), while backward goes on.
  void on_reduced(std::function<void(size_t)> callback) { hooks_.on_reduced = std::move(callback); }
  // The group's reduced gradient once its copy to the host has landed; any thread.
  const at::Tensor& settled(size_t group);
  // Stage 3: while a reduction is waited for inside backward, `advance` issues this
  // rank's next parameter gather (false when none is left), so a peer that waits on that
  // gather before it can launch the reduction is never stuck (Gloo: a wait blocks this
  // thread; an NCCL wait holds only the stream, and is not polled).
  void on_wait(std::function<bool()> advance) { hooks_.advance = std::move(advance); }

 private:
  // What the engine asked to be told, and asked to do while a reduction is waited for.
  struct Hooks {
    std::function<void(size_t, size_t)> on_gradient;
    std::function<void(size_t)> on_complete;
    std::function<void(size_t)> on_reduced;
    std::function<bool()> advance;
  };
  // Per group: its trainable parameters, and how many of their gradients this backward
  // has accumulated (counted by post-hooks on the AccumulateGrad nodes kept here).
  struct Arrivals {
    std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
    std::vector<int> expected;
    std::vector<int> arrived;
  };
  // What this backward does.
  struct Window {
    bool reducing = false;  // it reduces (every backward at stages 2-3, else the last)
    bool boundary = false;  // it ends the accumulation window
    int next = -1;          // the next group to launch, counting down
  };
  struct InFlight {
    size_t group;
    CommHandle handle;
    // Stage >= 2, or a shard landing on the host: the reduction's output before it is
    // accumulated (or landed).
    at::Tensor received;
  };
  // Per group, the fp32 gradient summed over ranks and micro-batches: what reduced()
  // returns (the gradient buffer itself for fp32 at stages 0-1, else a buffer of its own).
  struct Sums {
    std::vector<at::Tensor> fp32;
    std::vector<LedgerEntry> entries;
    std::vector<bool> clean;  // fp32[g] holds zeros: nothing accumulated since zero()
    // fp32[g] is clean but its memory was not zeroed: zero() leaves that to the first
    // read, since a backward's first reduction overwrites the whole buffer anyway (one
    // pass over every gradient byte a step saved). Bytes, not bits: read from any thread.
    std::vector<uint8_t> stale;
  };
  // Reductions launched and not yet accumulated, and the bytes of their outputs.
  struct Reductions {
    std::vector<InFlight> in_flight;
    std::vector<InFlight> across;  // shards in their all-reduce across groups
    LedgerEntry received_bytes;
  };

  void install_hooks();
  void on_accumulated(size_t group);
  void launch_ready();
  void launch(size_t group);
  void retire_oldest();
  void finish_across();  // the oldest all-reduce across groups
  void drain();          // every reduction in flight, both kinds
  bool sharded_grads() const { return options_.stage.shards_optimizer(); }
  // Whether the ranks' reduced gradients differ, so that the norm and the overflow check
  // need a sum over them: shards, or (stage 0) other ranks' experts.
  bool summed_across_ranks() const { return sharded_grads() || experts_ != nullptr; }
  Collectives* comm_of(size_t group) const {
    return experts_ && is_expert_[group] ? experts_ : comm_;
  }
  // Stage 0 with experts: the share of each rank's squares of `group` in the sum over comm_,
  // 1 / the ranks holding the same gradient (dp for dense groups, edp for experts').
  double square_weight(size_t group) const;
  Tier fp32_tier(size_t group) const;
  bool lands(size_t group) const;  // its reduced shard lands on the host (HostLandings)
  bool bounded() const;            // whether a reduction in flight holds buffers (see above)
  double norm_across_ranks(at::Tensor sum_squares, double scale);  // [1] double, this rank's
  // [1] double: the squares of counted_on_another_tp_rank's ranges, on `where`.
  at::Tensor squares_counted_elsewhere(const at::Device& where);
  void settle_all();
  void wait_issuing_gathers(const CommHandle& handle);
  void accumulate(const InFlight& f);
  const at::Tensor& sum(size_t group);    // sums_.fp32[group], zeroed first if stale
  const std::vector<at::Tensor>& sums();  // every one, as sum()
  void finished(size_t group);            // the group's reduced gradient is in sums_

  std::vector<FlatParamGroup*> groups_;
  const ReduceOptions options_;
  Collectives* comm_;
  Collectives* replicas_;  // null without shard groups
  Collectives* tensor_parallel_ = nullptr;
  Collectives* pipeline_parallel_ = nullptr;
  Collectives* experts_ = nullptr;
  std::vector<bool> is_expert_;
  MemoryLedger* ledger_;
  Sums sums_;
  Hooks hooks_;
  Arrivals arrivals_;
  Window window_;
  bool once_per_window_ = false;
  Reductions reductions_;
  std::unique_ptr<HostLandings> landings_;  // null: no reduced shard lands on the host
};

}  // namespace zeroshard
