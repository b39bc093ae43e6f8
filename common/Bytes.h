#pragma once
// Human sizes: "80GB" (10^9), "1.5TiB" (2^40), "4096" (bytes).
#include <cstdint>
#include <string>

namespace zeroshard {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Parses a size; throws Error naming `what` (e.g. "--gpu-mem") on anything else,
// including zero and negative sizes.
uint64_t parse_bytes(const std::string& text, const std::string& what);

// "12.34" (GiB, two decimals), the unit every report prints.
std::string format_gib(double bytes);

}  // namespace zeroshard
