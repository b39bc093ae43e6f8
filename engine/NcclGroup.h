#pragma once
// NCCL process groups for CUDA tensors, made by the GPU half of a build against a torch
// with CUDA (cuda/CudaRuntime.h), on machines without a GPU too; a build from a LibTorch
// without CUDA, or one whose GPU half does not load beside this torch, has none, and says
// why when a model on a GPU asks for one.
#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace zeroshard {

// Whether this build can make NCCL groups.
bool nccl_built();

// CUDA devices this process sees: 0 without a GPU, or in a build without CUDA.
int cuda_device_count();

// Why a GPU test or run cannot go on here, in one line ("" when it can).
std::string why_no_gpu();

// One NCCL group of `world` ranks over `store` (give each group its own prefix).
// `high_priority`: its collectives run on a high-priority stream (parameter gathers,
// which compute waits for). Makes `device_index` this process's current CUDA device.
c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int world, int device_index,
                                                  std::chrono::milliseconds timeout,
                                                  bool high_priority);

}  // namespace zeroshard
