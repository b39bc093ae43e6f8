#pragma once
// Minimal leveled logging to stderr, prefixed with the rank when one is known.
#include <string>
#include <utility>

#include <fmt/format.h>

namespace zeroshard {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

// Level from ZS_LOG_LEVEL (debug|info|warn|error), Info when unset.
LogLevel log_threshold();
void log_line(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_threshold() <= LogLevel::Info)
    log_line(LogLevel::Info, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  if (log_threshold() <= LogLevel::Warn)
    log_line(LogLevel::Warn, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace zeroshard
