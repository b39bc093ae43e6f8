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

// A message from LibTorch (c10::Error's what()) without the C++ backtrace it carries.
inline std::string without_backtrace(const std::string& what) {
  const auto at = what.find("\nException raised from");
  return at == std::string::npos ? what : what.substr(0, at);
}

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace zeroshard
