#include "common/FaultPoint.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

namespace zeroshard {
namespace {

struct Trigger {
  std::string point;
  long hit = 1;
};

Trigger parse_trigger(const char* text) {
  Trigger t;
  if (text == nullptr) return t;
  t.point = text;
  const auto at = t.point.find('@');
  if (at != std::string::npos) {
    t.hit = std::strtol(t.point.c_str() + at + 1, nullptr, 10);
    t.point.resize(at);
  }
  return t;
}

struct Hooks {
  Trigger kill = parse_trigger(std::getenv("ZS_TEST_KILL_AT"));
  Trigger pause = parse_trigger(std::getenv("ZS_TEST_PAUSE_AT"));
  Trigger skip = parse_trigger(std::getenv("ZS_TEST_SKIP_AT"));
  double pause_seconds = std::getenv("ZS_TEST_PAUSE_SECONDS")
                             ? std::strtod(std::getenv("ZS_TEST_PAUSE_SECONDS"), nullptr)
                             : 2.0;
  bool this_rank = std::getenv("ZS_TEST_KILL_RANK") == nullptr ||
                   std::string(std::getenv("ZS_TEST_KILL_RANK")) ==
                       (std::getenv("RANK") ? std::getenv("RANK") : "0");
  bool armed() const {
    return this_rank && !(kill.point.empty() && pause.point.empty() && skip.point.empty());
  }
  std::mutex mutex;
  std::unordered_map<std::string, long> passes;
};

Hooks& hooks() {
  static Hooks h;
  return h;
}

void say(const std::string& line) {
  // Straight to the descriptor: nothing buffered is lost to the SIGKILL.
  if (::write(STDERR_FILENO, line.data(), line.size()) < 0) return;
}

}  // namespace

void fault_point(const char* point) {
  Hooks& h = hooks();
  if (!h.armed()) return;
  long pass = 0;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    pass = ++h.passes[point];
  }
  const char* rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
  if (h.kill.point == point && h.kill.hit == pass) {
    say(fmt::format("zeroshard test hook: rank {} killed at {}@{}\n", rank, point, pass));
    ::raise(SIGKILL);
  }
  if (h.pause.point == point && h.pause.hit == pass) {
    say(fmt::format("zeroshard test hook: rank {} paused {} s at {}@{}\n", rank, h.pause_seconds,
                    point, pass));
    std::this_thread::sleep_for(std::chrono::duration<double>(h.pause_seconds));
  }
}

bool fault_skip(const char* point) {
  Hooks& h = hooks();
  if (!h.armed() || h.skip.point != point) return false;
  long pass = 0;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    pass = ++h.passes[std::string("skip:") + point];
  }
  if (h.skip.hit != pass) return false;
  const char* rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
  say(fmt::format("zeroshard test hook: rank {} skips {}@{}\n", rank, point, pass));
  return true;
}

}  // namespace zeroshard
