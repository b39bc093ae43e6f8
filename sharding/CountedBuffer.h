#pragma once
// A tensor whose storage can be given back and brought again while the views made of it
// stay valid (parameters and their .grad point into it, autograd keeps some), its bytes
// counted in the MemoryLedger as they come and go: a flat group's full buffer, its kept
// shard and its gradient buffer (sharding/FlatParamGroup.h).
#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"

namespace zeroshard {

class CountedBuffer {
 public:
  CountedBuffer() = default;
  // `tensor` is the buffer; `counted` of its bytes count under `tier` and `kind` now.
  CountedBuffer(at::Tensor tensor, MemoryLedger* ledger, Tier tier, Kind kind, int64_t counted);

  const at::Tensor& tensor() const { return tensor_; }
  int64_t bytes() const { return entry_.bytes(); }
  bool resident() const { return entry_.bytes() > 0; }
  // Fresh memory of `bytes` from the allocator the storage was made with (its device's:
  // host malloc, or CUDA's caching allocator), or none for 0. The contents are not kept:
  // every caller writes or zeroes all it brings back.
  void resize(int64_t bytes);
  // The same bytes counted under another tier from now on.
  void recount(MemoryLedger* ledger, Tier tier, Kind kind);

 private:
  at::Tensor tensor_;
  LedgerEntry entry_;
};

}  // namespace zeroshard
