#pragma once
// A group of parameters flattened into one buffer in compute precision, padded so
// each of `world` ranks owns an equal, aligned shard; the parameters become views
// into it, and their .grad views into a matching flat gradient buffer, so autograd
// accumulates straight into the buffer that is reduced.
//
// Sharded groups (stage 3) keep only this rank's shard between uses: the full buffer's
// storage is resized to 0 by release() and refilled in place by the gather, so views
// (and tensors autograd saved) stay valid across a release/gather cycle.
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"
#include "sharding/CopyStream.h"
#include "sharding/CountedBuffer.h"
#include "sharding/ShardQuantizer.h"
#include "zeroshard/Types.h"  // NamedParam

namespace zeroshard {

struct ParamSlot {
  std::string name;
  at::Tensor param;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
};

class FlatParamGroup {
 public:
  // Copies the parameters' current values into the buffer (cast to `dtype`) and
  // rebinds each parameter as a view of it.
  // `lazy_grads`: the gradient buffer starts released (stage >= 2 brings it into being
  // when its first gradient arrives).
  // `quantizer` (frozen groups only; it outlives the group): a sharded group keeps its shard
  // as the quantizer's bytes (counted as they are), decoded into own_slice() at each gather;
  // a group kept whole holds its weights as they decode (the same values, no saving).
  FlatParamGroup(const std::vector<NamedParam>& params, int rank, int world, at::ScalarType dtype,
                 bool sharded, bool with_grads, bool lazy_grads, MemoryLedger* ledger,
                 const ShardQuantizer* quantizer = nullptr);
  // The bytes a sharded group of `params` keeps on `rank`, in `dtype` or as `quantizer`'s
  // (nullptr: not quantized), before the group is built.
  static int64_t kept_bytes_of(const std::vector<NamedParam>& params, int rank, int world,
                               at::ScalarType dtype, const ShardQuantizer* quantizer);

  const std::vector<ParamSlot>& slots() const { return slots_; }
  int64_t numel() const { return numel_; }
  // Elements of the parameters weight_quantization codes (NamedParam::quantizable).
  int64_t quantizable_numel() const { return quantizable_numel_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t padded_numel() const { return shard_numel_ * world_; }
  bool sharded() const { return sharded_; }

  // The full buffer (for a sharded group, valid only while gathered).
  const at::Tensor& flat() const { return flat_.tensor(); }
  // This rank's shard of the parameters: a slice of flat(), or the kept shard (stage 3).
  at::Tensor param_shard() const;
  // The full gradient buffer and this rank's slice of it.
  const at::Tensor& flat_grad() const { return grad_.tensor(); }
  at::Tensor grad_shard() const;

  // Gradient buffer storage: released after its reduction at stage >= 2 and brought
  // back (zeroed) before the next backward.
  void release_grads();
  void materialize_grads();
  // Makes slot `slot`'s .grad the view of the flat gradient buffer again where it is
  // not: model.zero_grad() (set_to_none, torch's default; the Hugging Face Trainer calls
  // it) drops the views, and autograd would then accumulate into tensors of its own
  // that no reduction reads. Called before each accumulation.
  void keep_grad_view(size_t slot);
  void zero_grads();

  // Stage 3: make the full buffer's storage hold `bytes` again (its shard copied in
  // by the caller's all-gather) or give it back.
  bool gathered() const { return gathered_; }
  // `fill_own_shard` false: the caller fills own_slice() (the shard lives elsewhere).
  void allocate_full(bool fill_own_shard = true);
  void release_full();
  // Stage 3, after the full parameters were written: keep this rank's part of them.
  void keep_own_slice();
  at::Tensor own_slice() const {
    return flat_.tensor().narrow(0, rank_ * shard_numel_, shard_numel_);
  }

  // Stage-3 parameter offload: the kept shard's storage is given back while the shard
  // lives on another tier, and brought back (contents undefined) to be written.
  void release_shard();
  void materialize_shard();
  bool shard_resident() const { return kept_.buffer.resident(); }
  // The tier the kept shard is counted under while resident.
  void set_shard_tier(Tier tier, MemoryLedger* ledger);
  // Parameter offload on a GPU: the kept shard moves to page-locked host memory (gathers
  // copy it up to the full buffer), counted under the host tier. On the host: nothing.
  // A gather's copy up is queued on the current stream and the host goes on; before the
  // host writes the kept shard (a step, a checkpoint's load), settle_shard_read() waits
  // for the last such copy to end.
  void keep_shard_on_host(MemoryLedger* ledger);
  void settle_shard_read() const { kept_.read.wait(); }

  bool quantized() const { return quantizer_ != nullptr; }
  // A group kept whole with a quantizer: its weights (written anew, as GatheredParameters'
  // modifier does) become the values their codes decode to again.
  void requantize_whole();
  // The kept shard's size in bytes, quantized or not.
  int64_t kept_bytes() const { return kept_bytes_; }
  // A quantized shard's bytes, read from elsewhere (NVMe), decoded into `slice`.
  void decode_kept(const at::Tensor& kept_bytes, const at::Tensor& slice) const;

 private:
  void bind_views();
  void bind_param(ParamSlot& slot);
  void poison_params();
  std::vector<ParamSlot> slots_;
  int rank_;
  int world_;
  bool sharded_;
  bool with_grads_;
  bool gathered_ = true;
  int64_t numel_ = 0;
  int64_t quantizable_numel_ = 0;
  int64_t shard_numel_ = 0;
  int64_t kept_bytes_ = 0;
  const ShardQuantizer* quantizer_ = nullptr;
  std::vector<ShardSegment> segments_;               // this rank's shard, for quantizer_
  const ShardQuantizer* whole_quantizer_ = nullptr;  // a whole group's (requantize_whole)
  std::vector<TensorExtent> extents_;                // its tensors, for it
  struct KeptShard {                                 // stage 3 only
    CountedBuffer buffer;
    CopyDone read;  // in host memory: the last gather's copy of it to the device
  };
  CountedBuffer flat_;
  KeptShard kept_;
  CountedBuffer grad_;
  at::Tensor poison_;  // what released parameters point at
};

}  // namespace zeroshard
