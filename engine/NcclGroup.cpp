#include "engine/NcclGroup.h"

#include "common/Error.h"
#include "cuda/CudaRuntime.h"

namespace zeroshard {

bool nccl_built() {
  return cuda_runtime() != nullptr;
}

int cuda_device_count() {
  CudaRuntime* cuda = cuda_runtime();
  return cuda != nullptr ? cuda->device_count() : 0;
}

std::string why_no_gpu() {
  if (cuda_runtime() == nullptr) return cuda_unavailable();
  if (cuda_device_count() > 0) return "";
  return "no CUDA device visible (this build has CUDA and NCCL; run it on a GPU machine)";
}

c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int world, int device_index,
                                                  std::chrono::milliseconds timeout,
                                                  bool high_priority) {
  CudaRuntime* cuda = cuda_runtime();
  if (cuda == nullptr) {
    fail("the model's parameters are on a CUDA device, but there is no NCCL here: {}",
         cuda_unavailable());
  }
  if (device_index < 0 || device_index >= cuda->device_count()) {
    fail("rank {}: the model is on cuda:{}, but this process sees {} CUDA device(s)", rank,
         device_index, cuda->device_count());
  }
  return c10::intrusive_ptr<c10d::Backend>::reclaim(
      cuda->make_nccl_group(store.get(), rank, world, device_index, timeout, high_priority));
}

}  // namespace zeroshard
