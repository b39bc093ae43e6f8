#include "engine/DeviceMemory.h"

#include <unistd.h>

#include <algorithm>

#include "common/Error.h"
#include "engine/NcclGroup.h"

#ifdef ZS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace zeroshard {
namespace {

#ifdef ZS_WITH_CUDA
int64_t gpu_total_bytes(c10::DeviceIndex index) {
  cudaDeviceProp props{};
  const auto status = cudaGetDeviceProperties(&props, index);
  if (status != cudaSuccess) {
    fail("cannot read the memory size of cuda:{}: {}", static_cast<int>(index),
         cudaGetErrorString(status));
  }
  return static_cast<int64_t>(props.totalGlobalMem);
}
#endif

}  // namespace

int64_t host_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

int64_t device_capacity(const c10::Device& device, int local_ranks) {
  local_ranks = std::max(1, local_ranks);
  if (!device.is_cuda()) return host_memory_bytes() / local_ranks;
#ifdef ZS_WITH_CUDA
  // Ranks beyond the GPU count share GPUs (ZS_DIST_BACKEND=gloo): each gets its part.
  const int gpus = std::max(1, cuda_device_count());
  const int sharing = (local_ranks + gpus - 1) / gpus;
  return gpu_total_bytes(device.has_index() ? device.index() : 0) / sharing;
#else
  fail("the model is on {}, but this zeroshard was built against a LibTorch without CUDA",
       device.str());
#endif
}

std::optional<AllocatorStats> allocator_stats(const c10::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
#ifdef ZS_WITH_CUDA
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
  constexpr size_t kAggregate = 0;  // StatType::AGGREGATE: every pool together
  AllocatorStats out;
  out.allocated = stats.allocated_bytes[kAggregate].current;
  out.peak_allocated = stats.allocated_bytes[kAggregate].peak;
  out.peak_reserved = stats.reserved_bytes[kAggregate].peak;
  return out;
#else
  return std::nullopt;
#endif
}

}  // namespace zeroshard
