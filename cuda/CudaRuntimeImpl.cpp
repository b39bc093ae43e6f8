// libzeroshard_cuda.so: the calls into torch's CUDA libraries (cuda/CudaRuntime.h). It links
// libtorch_cuda, libc10_cuda and the CUDA runtime, and nothing of zeroshard's layers.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "cuda/CudaRuntime.h"

namespace zeroshard {
namespace {

class CudaRuntimeImpl final : public CudaRuntime {
 public:
  int device_count() override {
    // c10's count is 0 (with no exception) where the driver or a device is missing.
    return static_cast<int>(c10::cuda::device_count());
  }

  int64_t total_memory(int index, std::string* error) override {
    cudaDeviceProp props{};
    const cudaError_t status = cudaGetDeviceProperties(&props, index);
    if (status == cudaSuccess) return static_cast<int64_t>(props.totalGlobalMem);
    *error = cudaGetErrorString(status);
    return -1;
  }

  AllocatorStats allocator_stats(int index) override {
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
    constexpr size_t kAggregate = 0;  // StatType::AGGREGATE: every pool together
    AllocatorStats out;
    out.allocated = stats.allocated_bytes[kAggregate].current;
    out.peak_allocated = stats.allocated_bytes[kAggregate].peak;
    out.peak_reserved = stats.reserved_bytes[kAggregate].peak;
    return out;
  }

  bool page_lock(void* data, int64_t bytes, std::string* refusal) override {
    static const bool gpu = [] {
      int count = 0;
      const bool seen = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
      cudaGetLastError();  // a missing driver is an answer here, not an error for later calls
      return seen;
    }();
    if (!gpu) return false;
    const cudaError_t status =
        cudaHostRegister(data, static_cast<size_t>(bytes), cudaHostRegisterDefault);
    if (status == cudaSuccess) return true;
    cudaGetLastError();
    *refusal = cudaGetErrorString(status);
    return false;
  }

  void page_unlock(void* data) override { cudaHostUnregister(data); }

  c10d::Backend* make_nccl_group(c10d::Store* store, int rank, int world, int device_index,
                                 std::chrono::milliseconds timeout, bool high_priority) override {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
    auto options = c10d::ProcessGroupNCCL::Options::create(high_priority);
    options->timeout = timeout;
    auto shared = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(store);
    c10::intrusive_ptr<c10d::Backend> group =
        c10::make_intrusive<c10d::ProcessGroupNCCL>(shared, rank, world, options);
    return group.release();
  }
};

}  // namespace
}  // namespace zeroshard

extern "C" __attribute__((visibility("default"))) zeroshard::CudaRuntime* zeroshard_cuda_runtime() {
  static zeroshard::CudaRuntimeImpl runtime;
  return &runtime;
}
