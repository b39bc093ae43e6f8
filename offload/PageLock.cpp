#include "offload/PageLock.h"

#include <sys/resource.h>

#include <mutex>
#include <string>

#include "common/Bytes.h"
#include "common/Logging.h"
#include "cuda/CudaRuntime.h"

namespace zeroshard {
namespace {

std::string memlock_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return format_gib(static_cast<double>(limit.rlim_cur)) + " GiB";
}

}  // namespace

bool page_lock(void* data, int64_t bytes) {
  CudaRuntime* cuda = cuda_runtime();
  if (cuda == nullptr) return false;  // no GPU half: nothing to lock for
  std::string refusal;
  if (cuda->page_lock(data, bytes, &refusal)) return true;
  if (refusal.empty()) return false;  // no GPU visible
  static std::once_flag said;
  std::call_once(said, [&] {
    log_warn(
        "page-locking {} of host buffers was refused ({}; RLIMIT_MEMLOCK is {}): they stay "
        "pageable, so copies to and from the GPU are staged by the driver and do not overlap; "
        "raise the limit (ulimit -l) to page-lock them",
        format_gib(static_cast<double>(bytes)) + " GiB", refusal, memlock_limit());
  });
  return false;
}

void page_unlock(void* data) {
  if (CudaRuntime* cuda = cuda_runtime()) cuda->page_unlock(data);
}

}  // namespace zeroshard
