#include "sharding/ShardQuantizer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

// Elements coded at a time: whole groups, an even count (two 4-bit codes a byte), about
// 2^20, so the fp32 temporaries stay a few MiB whatever the shard's size.
int64_t chunk_numel(const QuantizedLayout& l) {
  const int64_t step = l.group_size % 2 == 0 ? l.group_size : 2 * l.group_size;
  return std::max<int64_t>(1, (int64_t{1} << 20) / step) * step;
}

// The values as a (groups, group_size) fp32 matrix, the last group padded with zeros.
at::Tensor grouped(const at::Tensor& values, const QuantizedLayout& l) {
  const int64_t n = values.numel();
  const int64_t padded = l.groups(n) * l.group_size;
  at::Tensor x = values.reshape(-1).to(at::kFloat);
  if (padded > n) x = at::cat({x, at::zeros({padded - n}, x.options())});
  return x.view({l.groups(n), l.group_size});
}

}  // namespace

at::Tensor ShardQuantizer::encode(const at::Tensor& values) const {
  const QuantizedLayout& l = layout_;
  const int64_t n = values.numel();
  at::NoGradGuard no_grad;
  at::Tensor out = at::zeros({l.bytes(n)}, values.options().dtype(at::kByte));
  const at::Tensor flat = values.reshape(-1);
  const int64_t chunk = chunk_numel(l);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t count = std::min(chunk, n - start);
    const at::Tensor x = grouped(flat.narrow(0, start, count), l);
    at::Tensor scale, minimum, codes;
    if (l.symmetric) {
      const double q = static_cast<double>((int64_t{1} << (l.bits - 1)) - 1);
      scale = x.abs().amax({1}, /*keepdim=*/true) / q;
      scale = at::where(scale > 0, scale, at::ones_like(scale));
      codes = (x / scale).round().clamp(-q, q) + (q + 1);
    } else {
      const double levels = static_cast<double>((int64_t{1} << l.bits) - 1);
      minimum = x.amin({1}, /*keepdim=*/true);
      scale = (x.amax({1}, /*keepdim=*/true) - minimum) / levels;
      scale = at::where(scale > 0, scale, at::ones_like(scale));
      codes = ((x - minimum) / scale).round().clamp(0, levels);
    }
    codes = codes.reshape(-1).narrow(0, 0, count).to(at::kByte);
    if (l.bits == 4) {
      if (count % 2 != 0) codes = at::cat({codes, at::zeros({1}, codes.options())});
      codes = codes.view({-1, 2});
      codes = at::bitwise_or(codes.select(1, 0), at::bitwise_left_shift(codes.select(1, 1), 4));
    }
    out.narrow(0, l.bits == 4 ? start / 2 : start, codes.numel()).copy_(codes);
    const int64_t group = start / l.group_size, groups = l.groups(count);
    out.narrow(0, l.scales_offset(n) + 4 * group, 4 * groups)
        .copy_(scale.reshape(-1).view(at::kByte));
    if (!l.symmetric) {
      out.narrow(0, l.mins_offset(n) + 4 * group, 4 * groups)
          .copy_(minimum.reshape(-1).view(at::kByte));
    }
  }
  return out;
}

void ShardQuantizer::decode(const at::Tensor& bytes_in, const at::Tensor& out) const {
  const QuantizedLayout& l = layout_;
  const int64_t n = out.numel();
  if (bytes_in.numel() != l.bytes(n))
    fail("a quantized shard of {} elements is {} bytes, not {}", n, l.bytes(n), bytes_in.numel());
  at::NoGradGuard no_grad;
  const at::Tensor bytes = bytes_in.to(out.device());
  const at::Tensor flat = out.reshape(-1);
  const int64_t chunk = chunk_numel(l);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t count = std::min(chunk, n - start);
    const int64_t group = start / l.group_size, groups = l.groups(count);
    at::Tensor codes =
        bytes.narrow(0, l.bits == 4 ? start / 2 : start, l.bits == 4 ? (count + 1) / 2 : count);
    if (l.bits == 4) {
      codes = at::stack({at::bitwise_and(codes, 15), at::bitwise_right_shift(codes, 4)}, 1)
                  .reshape(-1)
                  .narrow(0, 0, count);
    }
    // Byte offsets are multiples of 4 (the parts start at multiples of 16): fp32 views.
    const at::Tensor scale = bytes.narrow(0, l.scales_offset(n) + 4 * group, 4 * groups)
                                 .view(at::kFloat)
                                 .view({groups, 1});
    at::Tensor x = grouped(codes, l);
    if (l.symmetric) {
      x = (x - static_cast<double>(int64_t{1} << (l.bits - 1))) * scale;
    } else {
      const at::Tensor minimum = bytes.narrow(0, l.mins_offset(n) + 4 * group, 4 * groups)
                                     .view(at::kFloat)
                                     .view({groups, 1});
      x = x * scale + minimum;
    }
    flat.narrow(0, start, count).copy_(x.reshape(-1).narrow(0, 0, count));
  }
}

}  // namespace zeroshard
