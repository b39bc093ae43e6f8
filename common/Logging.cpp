#include "common/Logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zeroshard {

LogLevel log_threshold() {
  static const LogLevel level = [] {
    const char* env = std::getenv("ZS_LOG_LEVEL");
    if (env == nullptr) return LogLevel::Info;
    if (std::strcmp(env, "debug") == 0) return LogLevel::Debug;
    if (std::strcmp(env, "warn") == 0) return LogLevel::Warn;
    if (std::strcmp(env, "error") == 0) return LogLevel::Error;
    return LogLevel::Info;
  }();
  return level;
}

void log_line(LogLevel level, const std::string& message) {
  static const char* const kNames[] = {"debug", "info", "warning", "error"};
  const char* rank = std::getenv("RANK");
  if (rank != nullptr) {
    std::fprintf(stderr, "zeroshard[rank %s] %s: %s\n", rank, kNames[static_cast<int>(level)],
                 message.c_str());
  } else {
    std::fprintf(stderr, "zeroshard %s: %s\n", kNames[static_cast<int>(level)], message.c_str());
  }
}

}  // namespace zeroshard
