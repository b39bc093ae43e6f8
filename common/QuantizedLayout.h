#pragma once
// How a quantized shard lies in its bytes (config/Config.h WeightQuantization): the
// codes (one byte an element at 8 bits, two elements a byte at 4, the first in the low
// half), then an fp32 scale per group of group_size elements, then, when not symmetric,
// an fp32 minimum per group; each part starts at a multiple of 16 bytes. The memory model
// counts these bytes and sharding/ShardQuantizer.h writes and reads them.
#include <cstdint>

namespace zeroshard {

struct QuantizedLayout {
  int64_t bits = 8;
  int64_t group_size = 64;
  bool symmetric = false;

  static int64_t aligned(int64_t bytes) { return (bytes + 15) / 16 * 16; }
  int64_t groups(int64_t numel) const { return (numel + group_size - 1) / group_size; }
  int64_t codes_bytes(int64_t numel) const { return aligned(bits == 4 ? (numel + 1) / 2 : numel); }
  int64_t scales_offset(int64_t numel) const { return codes_bytes(numel); }
  int64_t mins_offset(int64_t numel) const {
    return scales_offset(numel) + aligned(4 * groups(numel));
  }
  int64_t bytes(int64_t numel) const {
    return mins_offset(numel) + (symmetric ? 0 : aligned(4 * groups(numel)));
  }
};

}  // namespace zeroshard
