#include "engine/NcclGroup.h"

#include "common/Error.h"

#ifdef ZS_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace zeroshard {

#ifdef ZS_WITH_CUDA

bool nccl_built() {
  return true;
}

int cuda_device_count() {
  // c10's count is 0 (with no exception) where the driver or a device is missing.
  return static_cast<int>(c10::cuda::device_count());
}

std::string why_no_gpu() {
  if (cuda_device_count() > 0) return "";
  return "no CUDA device visible (this build has CUDA and NCCL; run it on a GPU machine)";
}

c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int world, int device_index,
                                                  std::chrono::milliseconds timeout,
                                                  bool high_priority) {
  if (device_index < 0 || device_index >= cuda_device_count()) {
    fail("rank {}: the model is on cuda:{}, but this process sees {} CUDA device(s)", rank,
         device_index, cuda_device_count());
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  auto options = c10d::ProcessGroupNCCL::Options::create(high_priority);
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
}

#else  // a LibTorch without CUDA

bool nccl_built() {
  return false;
}

int cuda_device_count() {
  return 0;
}

std::string why_no_gpu() {
  return "this build's LibTorch has no CUDA (build against a CUDA torch, e.g. PyPI's)";
}

c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                  int, std::chrono::milliseconds, bool) {
  fail(
      "the model's parameters are on a CUDA device, but this zeroshard was built against a "
      "LibTorch without CUDA, so it has no NCCL; rebuild against a CUDA torch (PyPI's torch "
      "is one) or keep the model on the CPU");
}

#endif

}  // namespace zeroshard
