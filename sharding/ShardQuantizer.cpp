#include "sharding/ShardQuantizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

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
  const at::Tensor x = grouped(values, l);
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
  codes = codes.reshape(-1).narrow(0, 0, n).to(at::kByte);
  if (l.bits == 4) {
    if (n % 2 != 0) codes = at::cat({codes, at::zeros({1}, codes.options())});
    codes = codes.view({-1, 2});
    codes = at::bitwise_or(codes.select(1, 0), at::bitwise_left_shift(codes.select(1, 1), 4));
  }
  at::Tensor out = at::zeros({l.bytes(n)}, values.options().dtype(at::kByte));
  out.narrow(0, 0, codes.numel()).copy_(codes);
  const int64_t groups = l.groups(n);
  out.narrow(0, l.scales_offset(n), 4 * groups).copy_(scale.reshape(-1).view(at::kByte));
  if (!l.symmetric)
    out.narrow(0, l.mins_offset(n), 4 * groups).copy_(minimum.reshape(-1).view(at::kByte));
  return out;
}

void ShardQuantizer::decode(const at::Tensor& bytes_in, const at::Tensor& out) const {
  const QuantizedLayout& l = layout_;
  const int64_t n = out.numel();
  if (bytes_in.numel() != l.bytes(n))
    fail("a quantized shard of {} elements is {} bytes, not {}", n, l.bytes(n), bytes_in.numel());
  at::NoGradGuard no_grad;
  const at::Tensor bytes = bytes_in.to(out.device());
  const int64_t groups = l.groups(n);
  at::Tensor codes = bytes.narrow(0, 0, l.bits == 4 ? (n + 1) / 2 : n);
  if (l.bits == 4) {
    codes = at::stack({at::bitwise_and(codes, 15), at::bitwise_right_shift(codes, 4)}, 1)
                .reshape(-1)
                .narrow(0, 0, n);
  }
  const at::Tensor scale =
      bytes.narrow(0, l.scales_offset(n), 4 * groups).view(at::kFloat).view({groups, 1});
  at::Tensor x = grouped(codes, l);
  if (l.symmetric) {
    x = (x - static_cast<double>(int64_t{1} << (l.bits - 1))) * scale;
  } else {
    const at::Tensor minimum =
        bytes.narrow(0, l.mins_offset(n), 4 * groups).view(at::kFloat).view({groups, 1});
    x = x * scale + minimum;
  }
  out.copy_(x.reshape(-1).narrow(0, 0, n));
}

}  // namespace zeroshard
