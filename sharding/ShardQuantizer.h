#pragma once
// A frozen unit's shard kept quantized (common/QuantizedLayout.h): encode() turns its
// values into the layout's bytes, decode() writes them back, in the dtype and on the
// device of the slice given, as the unit is gathered. Groups of group_size consecutive
// elements share a scale: symmetric, codes -q..q around 0 (q = 2^(bits-1) - 1); else
// 0..2^bits - 1 from the group's minimum. A group whose values are all equal is exact.
#include <ATen/core/Tensor.h>

#include "common/QuantizedLayout.h"

namespace zeroshard {

class ShardQuantizer {
 public:
  explicit ShardQuantizer(QuantizedLayout layout) : layout_(layout) {}

  const QuantizedLayout& layout() const { return layout_; }
  // `values`: a 1-D floating tensor; returns uint8 bytes of layout().bytes(numel) on its device.
  at::Tensor encode(const at::Tensor& values) const;
  // `bytes` (uint8, any device) into `out` (1-D, numel elements).
  void decode(const at::Tensor& bytes, const at::Tensor& out) const;

 private:
  QuantizedLayout layout_;
};

}  // namespace zeroshard
