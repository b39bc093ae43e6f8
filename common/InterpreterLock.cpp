#include "common/InterpreterLock.h"

#include <atomic>

namespace zeroshard {
namespace {

std::atomic<InterpreterLockProbe> installed{nullptr};

}  // namespace

void set_interpreter_lock_probe(InterpreterLockProbe probe) {
  installed.store(probe);
}

bool interpreter_lock_held() {
  const InterpreterLockProbe probe = installed.load();
  return probe != nullptr && probe();
}

}  // namespace zeroshard
