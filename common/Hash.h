#pragma once
// FNV-1a, 64 bits: a hash that is the same on every rank, build and platform (std::hash is
// not), for comparing what ranks hold without sending it.
#include <cstdint>
#include <string_view>

namespace zeroshard {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;

// `h` carries a hash on over several pieces.
inline uint64_t fnv1a(std::string_view text, uint64_t h = kFnvOffset) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace zeroshard
