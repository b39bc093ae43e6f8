#pragma once
// A frozen unit's shard kept quantized (common/QuantizedLayout.h), as DeepSpeed's
// weight_quantization quantizes a model: only the weights of nn.Linear and nn.Embedding
// (NamedParam::quantizable), each on its own, in groups of group_size consecutive elements
// along dimension 1 counted from the weight's first element, whichever rank holds them; the
// other elements are kept as they are. The arithmetic is DeepSpeed's, in the compute dtype:
// scale = (2^bits - 1) / (max - min) (a reciprocal, then a product), codes
// round(clamp((x - min) * scale, 0, 2^bits - 1)), values codes / scale + min; a group whose
// values are all equal gives back its minimum. Symmetric groups (DeepSpeed has none) use
// scale = q / max|x| and codes round(clamp(x * scale, -q, q)) for q = 2^(bits-1) - 1.
//
// A rank's shard is cut where the flat buffer is cut, so a weight's group can straddle two
// ranks: encode() reads the whole groups from the full buffer, and both ranks keep that
// group's scale, so the values do not depend on the number of ranks.
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/QuantizedLayout.h"

namespace zeroshard {

// Where a tensor lies in a flat buffer, and whether it is quantized.
struct TensorExtent {
  int64_t offset = 0;
  int64_t numel = 0;
  bool quantized = false;
};

// One tensor's part of a shard, as offsets in the flat buffer.
struct ShardSegment {
  int64_t begin = 0;
  int64_t count = 0;
  bool quantized = false;
  int64_t tensor_offset = 0;  // where the tensor starts: its groups count from there
  int64_t tensor_numel = 0;
};

class ShardQuantizer {
 public:
  explicit ShardQuantizer(QuantizedLayout layout) : layout_(layout) {}
  const QuantizedLayout& layout() const { return layout_; }

  // The parts of [begin, begin + count) of a flat buffer holding `tensors`; elements past
  // the last tensor (the shard's padding) are kept.
  static std::vector<ShardSegment> segments(const std::vector<TensorExtent>& tensors, int64_t begin,
                                            int64_t count);
  int64_t bytes(const std::vector<ShardSegment>& segments, int64_t value_bytes) const;
  // `flat`: the full 1-D buffer (whole groups are read from it); returns uint8 bytes of
  // bytes(segments) on its device.
  at::Tensor encode(const at::Tensor& flat, const std::vector<ShardSegment>& segments) const;
  // `bytes` (uint8, any device) into `shard` (1-D, the segments' elements, in their dtype).
  void decode(const at::Tensor& bytes, const std::vector<ShardSegment>& segments,
              const at::Tensor& shard) const;

 private:
  QuantizedLayout layout_;
};

}  // namespace zeroshard
