#pragma once
// Host memory for the flat buffers that are given back and brought again (a stage-3
// unit's gathered parameters on a CPU device): each allocation is pages of its own,
// mapped when brought and unmapped when given back (but for the last two, kept for a
// buffer of their size), so memory released leaves the process. Through malloc it would not: glibc
// raises its mmap threshold after the first large free, and later buffers of that size come from
// the heap and stay in the process's RSS when freed, beyond what the MemoryLedger counts
// (docs/memory-model.md "Inference").
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

namespace zeroshard {

c10::Allocator* page_allocator();

// `numel` zeros with `options` (a CPU tensor) in a resizable storage of page_allocator(),
// which CountedBuffer::resize then allocates from.
at::Tensor page_backed_zeros(int64_t numel, const at::TensorOptions& options);

}  // namespace zeroshard
