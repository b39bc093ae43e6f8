#include "common/Bytes.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "common/Error.h"

namespace zeroshard {
namespace {

constexpr std::array<std::pair<const char*, double>, 11> kUnits{{
    {"", 1.0},
    {"b", 1.0},
    {"kb", 1e3},
    {"mb", 1e6},
    {"gb", 1e9},
    {"tb", 1e12},
    {"kib", 1024.0},
    {"mib", 1024.0 * 1024},
    {"gib", kGiB},
    {"tib", kGiB * 1024},
    {"pb", 1e15},
}};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

uint64_t parse_bytes(const std::string& text, const std::string& what) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  std::string unit = lower(std::string(end));
  unit.erase(0, unit.find_first_not_of(' '));
  const auto found =
      std::find_if(kUnits.begin(), kUnits.end(), [&](const auto& u) { return unit == u.first; });
  if (end == begin || found == kUnits.end() || !std::isfinite(number)) {
    fail(
        "{}: '{}' is not a size; allowed: a number with B, KB, MB, GB, TB (powers of 10) "
        "or KiB, MiB, GiB, TiB (powers of 2), e.g. 80GB or 1.5TiB",
        what, text);
  }
  const double bytes = number * found->second;
  if (!(bytes >= 1.0) || bytes > 1.8e19) {
    fail("{}: '{}' is out of range; allowed: a positive size below 16 EiB", what, text);
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_gib(double bytes) {
  return fmt::format("{:.2f}", bytes / kGiB);
}

}  // namespace zeroshard
