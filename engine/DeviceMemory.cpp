#include "engine/DeviceMemory.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "common/Error.h"
#include "cuda/CudaRuntime.h"

namespace zeroshard {
namespace {

CudaRuntime& cuda_for(const c10::Device& device) {
  CudaRuntime* cuda = cuda_runtime();
  if (cuda == nullptr) fail("the model is on {}, but {}", device.str(), cuda_unavailable());
  return *cuda;
}

}  // namespace

int64_t host_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

int64_t device_capacity(const c10::Device& device, int local_ranks) {
  local_ranks = std::max(1, local_ranks);
  if (!device.is_cuda()) return host_memory_bytes() / local_ranks;
  CudaRuntime& cuda = cuda_for(device);
  // Ranks beyond the GPU count share GPUs (ZS_DIST_BACKEND=gloo): each gets its part.
  const int gpus = std::max(1, cuda.device_count());
  const int sharing = (local_ranks + gpus - 1) / gpus;
  const int index = device.has_index() ? device.index() : 0;
  std::string error;
  const int64_t total = cuda.total_memory(index, &error);
  if (total < 0) fail("cannot read the memory size of cuda:{}: {}", index, error);
  return total / sharing;
}

std::optional<AllocatorStats> allocator_stats(const c10::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  return cuda_for(device).allocator_stats(device.has_index() ? device.index() : 0);
}

}  // namespace zeroshard
