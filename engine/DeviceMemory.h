#pragma once
// What the device tier holds and how large it is, as the hardware says: the host's RAM
// where the model is on the CPU (the device tier is host memory there), the GPU's own
// memory and its caching allocator's counts where it is on a GPU. The Planner budgets
// with device_capacity; memory_report() shows allocator_stats beside the ledger, whose
// kinds count only the runtime's own buffers (activations and autograd's temporaries
// are in the allocator's figures, not the ledger's).
#include <cstdint>
#include <optional>

#include <c10/core/Device.h>

#include "zeroshard/Types.h"  // AllocatorStats

namespace zeroshard {

// The host's physical RAM.
int64_t host_memory_bytes();

// Bytes of device memory one of `local_ranks` ranks on this machine may plan with: the
// host's RAM shared by all of them for a CPU device; a GPU's whole memory, shared by the
// ranks that share one GPU when there are more ranks than GPUs.
int64_t device_capacity(const c10::Device& device, int local_ranks);

// The caching allocator's counts for a CUDA device; none for the CPU, or in a build
// without CUDA.
std::optional<AllocatorStats> allocator_stats(const c10::Device& device);

}  // namespace zeroshard
