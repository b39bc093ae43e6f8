#include "sharding/ShardQuantizer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

// Groups coded at a time: about 2^20 elements, so the temporaries stay a few MiB whatever
// the weight's size.
int64_t chunk_groups(const QuantizedLayout& l) {
  return std::max<int64_t>(1, (int64_t{1} << 20) / l.group_size);
}

// A quantized segment's groups, counted from its weight's first element.
struct GroupSpan {
  int64_t first = 0;  // the group holding the segment's first element
  int64_t end = 0;    // one past the group holding its last
};

GroupSpan groups_of(const ShardSegment& s, int64_t group_size) {
  const int64_t from = s.begin - s.tensor_offset;
  return {from / group_size, (from + s.count + group_size - 1) / group_size};
}

struct Totals {
  int64_t quantized = 0, groups = 0, kept = 0;
};

Totals totals_of(const std::vector<ShardSegment>& segments, int64_t group_size) {
  Totals t;
  for (const ShardSegment& s : segments) {
    if (!s.quantized) {
      t.kept += s.count;
      continue;
    }
    const GroupSpan g = groups_of(s, group_size);
    t.quantized += s.count;
    t.groups += g.end - g.first;
  }
  return t;
}

// One symmetric group's codes sit at q + 1 above their signed value.
int64_t symmetric_limit(const QuantizedLayout& l) {
  return (int64_t{1} << (l.bits - 1)) - 1;
}

}  // namespace

std::vector<ShardSegment> ShardQuantizer::segments(const std::vector<TensorExtent>& tensors,
                                                   int64_t begin, int64_t count) {
  std::vector<ShardSegment> out;
  const int64_t end = begin + count;
  int64_t covered = begin;
  for (const TensorExtent& t : tensors) {
    const int64_t from = std::max(begin, t.offset), to = std::min(end, t.offset + t.numel);
    if (from >= to) continue;
    out.push_back({from, to - from, t.quantized, t.offset, t.numel});
    covered = to;
  }
  if (covered < end) out.push_back({covered, end - covered, false, covered, end - covered});
  return out;
}

int64_t ShardQuantizer::bytes(const std::vector<ShardSegment>& segments,
                              int64_t value_bytes) const {
  const Totals t = totals_of(segments, layout_.group_size);
  return layout_.bytes(t.quantized, t.groups, t.kept, value_bytes);
}

at::Tensor ShardQuantizer::encode(const at::Tensor& flat,
                                  const std::vector<ShardSegment>& segments) const {
  const QuantizedLayout& l = layout_;
  const int64_t g = l.group_size, vb = static_cast<int64_t>(flat.element_size());
  const Totals t = totals_of(segments, g);
  at::NoGradGuard no_grad;
  at::Tensor out =
      at::zeros({l.bytes(t.quantized, t.groups, t.kept, vb)}, flat.options().dtype(at::kByte));
  at::Tensor codes = at::zeros({t.quantized}, out.options());  // one byte a code, packed below
  const int64_t scales = l.scales_offset(t.quantized);
  const int64_t mins = l.mins_offset(t.quantized, t.groups, vb);
  const int64_t kept = l.kept_offset(t.quantized, t.groups, vb);
  int64_t code_at = 0, group_at = 0, kept_at = 0;
  for (const ShardSegment& s : segments) {
    if (!s.quantized) {
      out.narrow(0, kept + vb * kept_at, vb * s.count)
          .copy_(flat.narrow(0, s.begin, s.count).contiguous().view(at::kByte));
      kept_at += s.count;
      continue;
    }
    if (s.tensor_numel % g != 0)
      fail("a quantized weight of {} elements is not whole groups of {}", s.tensor_numel, g);
    const GroupSpan span = groups_of(s, g);
    for (int64_t first = span.first; first < span.end; first += chunk_groups(l)) {
      const int64_t n = std::min(chunk_groups(l), span.end - first);
      const int64_t start = s.tensor_offset + first * g;
      const at::Tensor x = flat.narrow(0, start, n * g).view({n, g});
      at::Tensor scale, minimum, q;
      if (l.symmetric) {
        const int64_t limit = symmetric_limit(l);
        scale = x.abs().amax({1}, /*keepdim=*/true).reciprocal() * limit;
        q = (x * scale).clamp_(-limit, limit).round_().nan_to_num_(0).add_(limit + 1);
      } else {
        const int64_t levels = (int64_t{1} << l.bits) - 1;
        minimum = x.amin({1}, /*keepdim=*/true);
        scale = (x.amax({1}, /*keepdim=*/true) - minimum).reciprocal() * levels;
        // A group of equal values: 0 x inf; its code is 0, and 0 / inf + min its minimum.
        q = ((x - minimum) * scale).clamp_(0, levels).round_().nan_to_num_(0);
      }
      const int64_t lo = std::max(s.begin, start), hi = std::min(s.begin + s.count, start + n * g);
      codes.narrow(0, code_at + lo - s.begin, hi - lo)
          .copy_(q.reshape(-1).narrow(0, lo - start, hi - lo).to(at::kByte));
      const int64_t at_group = group_at + first - span.first;
      out.narrow(0, scales + vb * at_group, vb * n).copy_(scale.reshape(-1).view(at::kByte));
      if (!l.symmetric)
        out.narrow(0, mins + vb * at_group, vb * n).copy_(minimum.reshape(-1).view(at::kByte));
    }
    code_at += s.count;
    group_at += span.end - span.first;
  }
  if (l.bits == 4) {
    if (t.quantized % 2 != 0) codes = at::cat({codes, at::zeros({1}, codes.options())});
    codes = codes.view({-1, 2});
    codes = at::bitwise_or(codes.select(1, 0), at::bitwise_left_shift(codes.select(1, 1), 4));
  }
  out.narrow(0, 0, codes.numel()).copy_(codes);
  return out;
}

void ShardQuantizer::decode(const at::Tensor& bytes_in, const std::vector<ShardSegment>& segments,
                            const at::Tensor& shard) const {
  const QuantizedLayout& l = layout_;
  const int64_t g = l.group_size, vb = static_cast<int64_t>(shard.element_size());
  const Totals t = totals_of(segments, g);
  const int64_t want = l.bytes(t.quantized, t.groups, t.kept, vb);
  if (bytes_in.numel() != want || t.quantized + t.kept != shard.numel()) {
    fail("a quantized shard of {} elements is {} bytes, not {}", shard.numel(), want,
         bytes_in.numel());
  }
  at::NoGradGuard no_grad;
  const at::Tensor bytes = bytes_in.to(shard.device());
  const at::ScalarType dtype = shard.scalar_type();
  at::Tensor codes = bytes.narrow(0, 0, l.bits == 4 ? (t.quantized + 1) / 2 : t.quantized);
  if (l.bits == 4) {
    codes = at::stack({at::bitwise_and(codes, 15), at::bitwise_right_shift(codes, 4)}, 1)
                .reshape(-1)
                .narrow(0, 0, t.quantized);
  }
  // Parts start at multiples of 16 bytes and hold whole values: views in the dtype.
  const auto values = [&](int64_t offset, int64_t count) {
    return bytes.narrow(0, offset, vb * count).view(dtype);
  };
  const int64_t scales = l.scales_offset(t.quantized);
  const int64_t mins = l.mins_offset(t.quantized, t.groups, vb);
  const int64_t kept = l.kept_offset(t.quantized, t.groups, vb);
  const int64_t shard_begin = segments.empty() ? 0 : segments.front().begin;
  int64_t code_at = 0, group_at = 0, kept_at = 0;
  for (const ShardSegment& s : segments) {
    const at::Tensor dest = shard.narrow(0, s.begin - shard_begin, s.count);
    if (!s.quantized) {
      dest.copy_(values(kept + vb * kept_at, s.count));
      kept_at += s.count;
      continue;
    }
    const GroupSpan span = groups_of(s, g);
    for (int64_t first = span.first; first < span.end; first += chunk_groups(l)) {
      const int64_t n = std::min(chunk_groups(l), span.end - first);
      const int64_t start = s.tensor_offset + first * g;
      const int64_t lo = std::max(s.begin, start), hi = std::min(s.begin + s.count, start + n * g);
      at::Tensor x = at::zeros({n * g}, shard.options());
      x.narrow(0, lo - start, hi - lo).copy_(codes.narrow(0, code_at + lo - s.begin, hi - lo));
      x = x.view({n, g});
      const int64_t at_group = group_at + first - span.first;
      const at::Tensor scale = values(scales + vb * at_group, n).view({n, 1});
      if (l.symmetric) {
        x.sub_(symmetric_limit(l) + 1).div_(scale);
      } else {
        x.div_(scale).add_(values(mins + vb * at_group, n).view({n, 1}));
      }
      dest.narrow(0, lo - s.begin, hi - lo).copy_(x.view(-1).narrow(0, lo - start, hi - lo));
    }
    code_at += s.count;
    group_at += span.end - span.first;
  }
}

}  // namespace zeroshard
