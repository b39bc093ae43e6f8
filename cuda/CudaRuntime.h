#pragma once
// The GPU half of a build against a torch with CUDA. What needs torch's CUDA libraries
// (the CUDA runtime, c10's CUDA allocator, c10d's NCCL group) lives in a shared library of
// its own, libzeroshard_cuda.so (cuda/CudaRuntimeImpl.cpp), loaded the first time it is
// asked for: the rest of zeroshard links only torch's CPU libraries, so a build made with
// CUDA imports, plans and trains on the CPU beside a torch without CUDA too, and says why
// on its first GPU call instead of failing to load.
#include <chrono>
#include <cstdint>
#include <string>

#include "zeroshard/Types.h"  // AllocatorStats

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace zeroshard {

// What libzeroshard_cuda.so does. Its calls report in their results rather than through
// common/ (the library carries no copy of the layers, so it has no logger of its own).
class CudaRuntime {
 public:
  virtual ~CudaRuntime() = default;
  // CUDA devices this process sees: 0 where the driver or a device is missing.
  virtual int device_count() = 0;
  // Device `index`'s memory in bytes, or -1 with `error` set.
  virtual int64_t total_memory(int index, std::string* error) = 0;
  // The caching allocator's counts for device `index`.
  virtual AllocatorStats allocator_stats(int index) = 0;
  // cudaHostRegister: true when [data, data + bytes) is now page-locked; false with
  // `refusal` set when the driver refused it, false with it empty where no GPU is visible.
  virtual bool page_lock(void* data, int64_t bytes, std::string* refusal) = 0;
  virtual void page_unlock(void* data) = 0;
  // An NCCL group of `world` ranks over `store`, device `device_index` made current first.
  // The caller owns the reference returned (c10::intrusive_ptr's reclaim): raw pointers
  // keep this header, which offload/ includes, free of LibTorch.
  virtual c10d::Backend* make_nccl_group(c10d::Store* store, int rank, int world, int device_index,
                                         std::chrono::milliseconds timeout, bool high_priority) = 0;
};

// Whether this build has the GPU half (it was built against a torch with CUDA).
bool cuda_built();
// The GPU half, loaded on the first call; nullptr where the build has none or where it does
// not load beside this process's torch (cuda_unavailable() says why).
CudaRuntime* cuda_runtime();
// Why cuda_runtime() is nullptr, in one sentence ("" when it is not).
std::string cuda_unavailable();

}  // namespace zeroshard

// The one symbol libzeroshard_cuda.so exports: its CudaRuntime, made once.
extern "C" zeroshard::CudaRuntime* zeroshard_cuda_runtime();
