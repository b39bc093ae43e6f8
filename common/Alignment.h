#pragma once
#include <cstdint>

namespace zeroshard {

// Each rank's shard of a flat buffer starts on this many elements, so shards are
// aligned for vector loads and O_DIRECT I/O whatever the element size (64 x 4 B = 256 B).
constexpr int64_t kShardAlignElements = 64;

// Alignment O_DIRECT needs for buffers, sizes and offsets.
constexpr int64_t kIoAlignment = 4096;

// x86-64's transparent huge page: large swap buffers start on one (offload/PinnedPool.cpp).
constexpr int64_t kHugePageBytes = int64_t{2} << 20;

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
constexpr int64_t round_up(int64_t a, int64_t multiple) {
  return ceil_div(a, multiple) * multiple;
}

// Elements each of `ranks` ranks owns of a flat buffer of `numel` elements once it is
// padded so every shard is equal and aligned.
constexpr int64_t padded_shard_numel(int64_t numel, int64_t ranks) {
  return round_up(ceil_div(numel, ranks), kShardAlignElements);
}

}  // namespace zeroshard
