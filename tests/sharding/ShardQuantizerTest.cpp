// Quantized shards against values worked out by hand (common/QuantizedLayout.h's layout).
#include "sharding/ShardQuantizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using namespace zeroshard;

namespace {

at::Tensor values(std::vector<float> v) {
  return at::tensor(v, at::kFloat);
}

at::Tensor round_trip(const ShardQuantizer& q, const at::Tensor& x) {
  at::Tensor out = at::empty_like(x);
  q.decode(q.encode(x), out);
  return out;
}

}  // namespace

// 8 bits from the group's minimum: [0, 1, 2, ..., 255] x 0.5 + 3 spans 255 steps exactly.
TEST(ShardQuantizer, EightBitsAsymmetricAreExactOnTheirGrid) {
  const ShardQuantizer q({8, 256, false});
  const at::Tensor x = at::arange(256, at::kFloat) * 0.5 + 3;
  EXPECT_TRUE(at::equal(round_trip(q, x), x));
  // 256 code bytes, one fp32 scale and one minimum, each part padded to 16 bytes.
  EXPECT_EQ(q.encode(x).numel(), 256 + 16 + 16);
}

// 4 bits symmetric: codes -7..7 around 0; the group [-7, 0, 3.5, 7] has scale 1 and 3.5
// rounds to 4 (torch rounds half to even).
TEST(ShardQuantizer, FourBitsSymmetricRoundToTheNearestStep) {
  const ShardQuantizer q({4, 4, true});
  const at::Tensor got = round_trip(q, values({-7, 0, 3.5, 7, 1, 1, 1, 1, 0.5}));
  EXPECT_TRUE(at::equal(got, values({-7, 0, 4, 7, 1, 1, 1, 1, 0.5}))) << got;
  // Nine elements: five bytes of codes (two a byte), three groups' scales, no minimum.
  EXPECT_EQ(q.encode(values({-7, 0, 3.5, 7, 1, 1, 1, 1, 0.5})).numel(), 16 + 16);
}

// A group of equal values (a norm's weights of one) is exact however few the bits; the
// error of any other is at most half a step, (max - min) / 15 / 2 at 4 bits.
TEST(ShardQuantizer, ErrorsStayWithinHalfAStep) {
  const ShardQuantizer q({4, 64, false});
  EXPECT_TRUE(at::equal(round_trip(q, at::ones({64})), at::ones({64})));
  at::manual_seed(0);
  const at::Tensor x = at::randn({64 * 10 + 5});
  const at::Tensor got = round_trip(q, x);
  const at::Tensor padded = at::cat({x, at::zeros({59})}).view({11, 64});
  const at::Tensor step = (padded.amax(1) - padded.amin(1)) / 15;
  const at::Tensor err = at::cat({got - x, at::zeros({59})}).view({11, 64}).abs().amax(1);
  EXPECT_TRUE((err <= step / 2 + 1e-6).all().item<bool>()) << err << step;
}

// Shards longer than the 2^20 elements coded at a time: the chunks' groups, codes and scales
// land where one pass would put them (an odd count, so the last byte holds one 4-bit code).
TEST(ShardQuantizer, LongShardsAreCodedInChunksAsInOnePass) {
  const ShardQuantizer q({4, 48, false});
  at::manual_seed(1);
  const int64_t n = 3 * (int64_t{1} << 20) + 7;
  const at::Tensor x = at::randn({n});
  const at::Tensor bytes = q.encode(x);
  EXPECT_EQ(bytes.numel(), q.layout().bytes(n));
  const at::Tensor got = round_trip(q, x);
  // Each group against its own range, computed here in one pass.
  const int64_t groups = q.layout().groups(n);
  const at::Tensor padded = at::cat({x, at::zeros({groups * 48 - n})}).view({groups, 48});
  const at::Tensor step = (padded.amax(1) - padded.amin(1)) / 15;
  const at::Tensor err =
      at::cat({got - x, at::zeros({groups * 48 - n})}).view({groups, 48}).abs().amax(1);
  EXPECT_TRUE((err <= step / 2 + 1e-6).all().item<bool>());
  const ShardQuantizer small({4, 48, false});
  EXPECT_TRUE(at::equal(small.encode(x.narrow(0, 0, 96)).narrow(0, 0, 48), bytes.narrow(0, 0, 48)));
}

TEST(ShardQuantizer, DecodesIntoTheSlicesDtype) {
  const ShardQuantizer q({8, 4, false});
  at::Tensor out = at::empty({4}, at::kBFloat16);
  q.decode(q.encode(values({1, 2, 3, 4})), out);
  EXPECT_TRUE(at::equal(out, values({1, 2, 3, 4}).to(at::kBFloat16)));
  at::Tensor wrong = at::empty({100}, at::kFloat);  // 336 bytes, not 48
  EXPECT_THROW(q.decode(q.encode(values({1, 2, 3, 4})), wrong), std::exception);
}
