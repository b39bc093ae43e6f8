// Quantized shards against values worked out by hand and against DeepSpeed's arithmetic
// written out here (common/QuantizedLayout.h's layout, sharding/ShardQuantizer.h).
#include "sharding/ShardQuantizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using namespace zeroshard;

namespace {

at::Tensor values(std::vector<float> v) {
  return at::tensor(v, at::kFloat);
}

// The whole flat buffer as one rank's shard of it: encoded, then decoded.
at::Tensor round_trip(const ShardQuantizer& q, const at::Tensor& flat,
                      const std::vector<TensorExtent>& tensors) {
  const auto segments = ShardQuantizer::segments(tensors, 0, flat.numel());
  at::Tensor out = at::empty_like(flat);
  q.decode(q.encode(flat, segments), segments, out);
  return out;
}

at::Tensor round_trip(const ShardQuantizer& q, const at::Tensor& weight) {
  return round_trip(q, weight, {{0, weight.numel(), true}});
}

// DeepSpeed's asymmetric quantize and dequantize (its inference/quantization/utils.py
// Quantizer and DeQuantizer), in the weight's dtype, groups of `size` along the flat weight.
at::Tensor deepspeed_asymmetric(const at::Tensor& w, int64_t bits, int64_t size) {
  const at::Tensor x = w.reshape({-1, size});
  const at::Tensor low = x.amin({1}, true), high = x.amax({1}, true);
  const int64_t levels = (int64_t{1} << bits) - 1;
  const at::Tensor scale = (high - low).reciprocal() * levels;  // q_range / (max - min)
  const at::Tensor codes = ((x - low) * scale).clamp(0, levels).round().to(at::kByte);
  return codes.to(w.scalar_type()).div_(scale).add_(low).reshape(w.sizes());
}

}  // namespace

// 8 bits from the group's minimum: [0, 1, 2, ..., 255] x 0.5 + 3 spans 255 steps exactly.
TEST(ShardQuantizer, EightBitsAsymmetricAreExactOnTheirGrid) {
  const ShardQuantizer q({8, 256, false});
  const at::Tensor x = at::arange(256, at::kFloat) * 0.5 + 3;
  EXPECT_TRUE(at::equal(round_trip(q, x), x));
  // 256 code bytes, one fp32 scale and one minimum, each part padded to 16 bytes.
  EXPECT_EQ(q.bytes(ShardQuantizer::segments({{0, 256, true}}, 0, 256), 4), 256 + 16 + 16);
}

// 4 bits symmetric: codes -7..7 around 0; the group [-7, 0, 3.5, 7] has scale 1 and 3.5
// rounds to 4 (torch rounds half to even). A group of zeros stays zeros.
TEST(ShardQuantizer, FourBitsSymmetricRoundToTheNearestStep) {
  const ShardQuantizer q({4, 4, true});
  const at::Tensor got = round_trip(q, values({-7, 0, 3.5, 7, 1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_TRUE(at::equal(got, values({-7, 0, 4, 7, 1, 1, 1, 1, 0, 0, 0, 0}))) << got;
}

// Every group against DeepSpeed's formula in fp32 and bf16, in 8 and 4 bits; a group of
// equal values (DeepSpeed: a code of 0 x inf, then 0 / inf + min) gives back its value.
TEST(ShardQuantizer, AsymmetricGroupsAreDeepSpeeds) {
  at::manual_seed(0);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t bits : {8, 4}) {
      const ShardQuantizer q({bits, 64, false});
      at::Tensor w = at::randn({12, 128}).to(dtype);
      w[3].fill_(0.25);  // two groups of one value
      const at::Tensor got = round_trip(q, w.reshape(-1)).view({12, 128});
      EXPECT_TRUE(at::equal(got, deepspeed_asymmetric(w, bits, 64))) << dtype << " " << bits;
      EXPECT_TRUE(at::equal(got[3], w[3]));
    }
  }
}

// Norms and biases are kept as they are; the bytes are the codes, a scale and a minimum
// per group in the dtype (bf16: 2 bytes), and the kept values, each part padded to 16.
TEST(ShardQuantizer, OnlyTheWeightsAreCoded) {
  const ShardQuantizer q({4, 32, false});
  at::manual_seed(1);
  const at::Tensor flat = at::randn({64 + 7 + 96}).to(at::kBFloat16);
  const std::vector<TensorExtent> tensors = {{0, 64, true}, {64, 7, false}, {71, 96, true}};
  const at::Tensor got = round_trip(q, flat, tensors);
  EXPECT_TRUE(at::equal(got.narrow(0, 64, 7), flat.narrow(0, 64, 7)));
  EXPECT_TRUE(
      at::equal(got.narrow(0, 71, 96), deepspeed_asymmetric(flat.narrow(0, 71, 96), 4, 32)));
  const auto segments = ShardQuantizer::segments(tensors, 0, flat.numel());
  // 160 codes in 80 bytes; 5 groups: 10 bytes of scales, 10 of minimums; 7 kept: 14 bytes.
  EXPECT_EQ(q.bytes(segments, 2), 80 + 16 + 16 + 16);
}

// A weight's groups count from its first element wherever the ranks' shards cut it: the
// values served do not depend on the number of ranks, and each rank's bytes stay within
// the memory model's bound for a shard of its size.
TEST(ShardQuantizer, ShardsCutInsideGroupsDecodeAsTheWhole) {
  at::manual_seed(2);
  const std::vector<TensorExtent> tensors = {
      {0, 3 * 64, true}, {192, 64, false}, {256, 5 * 64, true}, {576, 3, false}};
  const int64_t numel = 579;
  for (const bool symmetric : {false, true}) {
    const ShardQuantizer q({8, 32, symmetric});
    const at::Tensor whole = at::randn({numel});
    const at::Tensor want = round_trip(q, whole, tensors);
    for (const int64_t world : {2, 3, 7}) {
      const int64_t shard = (numel + world - 1) / world;
      at::Tensor flat = at::cat({whole, at::zeros({shard * world - numel})});
      at::Tensor got = at::empty_like(flat);
      for (int64_t rank = 0; rank < world; ++rank) {
        const auto segments = ShardQuantizer::segments(tensors, rank * shard, shard);
        const at::Tensor bytes = q.encode(flat, segments);
        EXPECT_LE(bytes.numel(), q.layout().shard_bytes_bound(shard, shard * world, 8 * 64, 4));
        q.decode(bytes, segments, got.narrow(0, rank * shard, shard));
      }
      EXPECT_TRUE(at::equal(got.narrow(0, 0, numel), want)) << world << " ranks";
    }
  }
}

// The plan's bound holds for every rank whichever part costs more: groups of 2 make a
// coded bf16 element (1 byte and two 2-byte values per 2) dearer than a kept one.
TEST(ShardQuantizer, TheBoundHoldsWhicheverPartCostsMore) {
  at::manual_seed(4);
  const std::vector<TensorExtent> tensors = {{0, 40, false}, {40, 128, true}, {168, 6, false}};
  const at::Tensor whole = at::randn({174}).to(at::kBFloat16);
  for (const int64_t g : {2, 32}) {
    const ShardQuantizer q({8, g, false});
    for (const int64_t world : {2, 3, 7}) {
      const int64_t shard = (174 + world - 1) / world;
      const at::Tensor flat = at::cat({whole, at::zeros({shard * world - 174}, whole.options())});
      for (int64_t rank = 0; rank < world; ++rank) {
        const int64_t bytes =
            q.encode(flat, ShardQuantizer::segments(tensors, rank * shard, shard)).numel();
        EXPECT_LE(bytes, q.layout().shard_bytes_bound(shard, shard * world, 128, 2))
            << "group " << g << ", rank " << rank << " of " << world;
      }
    }
  }
}

// Weights longer than the 2^20 elements coded at a time: chunks land where one pass puts them.
TEST(ShardQuantizer, LongWeightsAreCodedInChunksAsInOnePass) {
  const ShardQuantizer q({4, 48, false});
  at::manual_seed(3);
  const at::Tensor w = at::randn({3 * (int64_t{1} << 20) / 48 + 5, 48});
  EXPECT_TRUE(
      at::equal(round_trip(q, w.reshape(-1)).view(w.sizes()), deepspeed_asymmetric(w, 4, 48)));
}

TEST(ShardQuantizer, RefusesBytesOfAnotherShard) {
  const ShardQuantizer q({8, 4, false});
  const auto segments = ShardQuantizer::segments({{0, 4, true}}, 0, 4);
  const at::Tensor bytes = q.encode(values({1, 2, 3, 4}), segments);
  at::Tensor wrong = at::empty({100}, at::kFloat);
  EXPECT_THROW(q.decode(bytes, ShardQuantizer::segments({{0, 100, true}}, 0, 100), wrong),
               std::exception);
  EXPECT_THROW(q.encode(values({1, 2, 3, 4, 5, 6}), ShardQuantizer::segments({{0, 6, true}}, 0, 6)),
               std::exception);  // not whole groups of 4
}
