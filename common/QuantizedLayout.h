#pragma once
// How a quantized shard lies in its bytes (config/Config.h WeightQuantization): the codes
// of its quantized elements (one byte an element at 8 bits, two elements a byte at 4, the
// first in the low half), then a scale per group of group_size elements, then, when not
// symmetric, a minimum per group, then the elements kept as they are (norms, biases: what
// is not a weight DeepSpeed quantizes); scales, minimums and kept elements in the compute
// dtype (`value_bytes` each), as DeepSpeed keeps them; each part starts at a multiple of
// 16 bytes. The memory model counts these bytes and sharding/ShardQuantizer.h writes and
// reads them.
#include <algorithm>
#include <cstdint>

namespace zeroshard {

struct QuantizedLayout {
  int64_t bits = 8;
  int64_t group_size = 64;
  bool symmetric = false;

  static int64_t aligned(int64_t bytes) { return (bytes + 15) / 16 * 16; }
  int64_t codes_bytes(int64_t quantized) const {
    return aligned(bits == 4 ? (quantized + 1) / 2 : quantized);
  }
  int64_t scales_offset(int64_t quantized) const { return codes_bytes(quantized); }
  int64_t mins_offset(int64_t quantized, int64_t groups, int64_t value_bytes) const {
    return scales_offset(quantized) + aligned(value_bytes * groups);
  }
  int64_t kept_offset(int64_t quantized, int64_t groups, int64_t value_bytes) const {
    return mins_offset(quantized, groups, value_bytes) +
           (symmetric ? 0 : aligned(value_bytes * groups));
  }
  // A shard of `quantized` coded elements in `groups` groups and `kept` elements as they are.
  int64_t bytes(int64_t quantized, int64_t groups, int64_t kept, int64_t value_bytes) const {
    return kept_offset(quantized, groups, value_bytes) + aligned(value_bytes * kept);
  }
  // The most one rank's shard of `shard` elements can take, of a unit of `numel` elements
  // (padding included) of which `quantizable` belong to quantized weights: the larger of its
  // two extremes, every element that is not a weight's in this shard first or every weight's
  // first (which costs more depends on group_size and the dtype), each part's padding to 16
  // bytes counted whether or not the extreme has the part, and the coded elements spanning
  // at most two groups more than their count fills (a shard's first and last weight may
  // start or end inside a group; weights between are whole groups).
  int64_t shard_bytes_bound(int64_t shard, int64_t numel, int64_t quantizable,
                            int64_t value_bytes) const {
    const auto extreme = [&](int64_t kept) {
      const int64_t quantized = shard - kept;
      return bytes(quantized, quantized / group_size + 2, kept, value_bytes);
    };
    const int64_t most_kept = std::min(shard, numel - quantizable);
    const int64_t least_kept = shard - std::min(shard, quantizable);
    return std::max(extreme(most_kept), extreme(least_kept)) + 3 * 16;
  }
};

}  // namespace zeroshard
