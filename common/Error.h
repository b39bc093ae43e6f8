#pragma once
// The one error type of zeroshard: every message names what was wrong, the value
// and what is allowed, so callers print it as it is and exit non-zero.
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace zeroshard {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace zeroshard
