#include "offload/PageLock.h"

#include <string>

#include "common/Logging.h"

#ifdef ZS_WITH_CUDA
#include <sys/resource.h>

#include <mutex>

#include <cuda_runtime_api.h>

#include "common/Bytes.h"
#endif

namespace zeroshard {

#ifdef ZS_WITH_CUDA
namespace {

std::string memlock_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return format_gib(static_cast<double>(limit.rlim_cur)) + " GiB";
}

}  // namespace

bool page_lock(void* data, int64_t bytes) {
  static const bool gpu = [] {
    int count = 0;
    const bool seen = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    cudaGetLastError();  // a missing driver is an answer here, not an error for later calls
    return seen;
  }();
  if (!gpu) return false;
  const cudaError_t rc =
      cudaHostRegister(data, static_cast<size_t>(bytes), cudaHostRegisterDefault);
  if (rc == cudaSuccess) return true;
  cudaGetLastError();
  static std::once_flag said;
  std::call_once(said, [&] {
    log_warn(
        "page-locking {} of host buffers was refused ({}; RLIMIT_MEMLOCK is {}): they stay "
        "pageable, so copies to and from the GPU are staged by the driver and do not overlap; "
        "raise the limit (ulimit -l) to page-lock them",
        format_gib(static_cast<double>(bytes)) + " GiB", cudaGetErrorString(rc), memlock_limit());
  });
  return false;
}

void page_unlock(void* data) {
  cudaHostUnregister(data);
}

#else  // a build without CUDA: nothing to lock for

bool page_lock(void*, int64_t) {
  return false;
}

void page_unlock(void*) {}

#endif

}  // namespace zeroshard
