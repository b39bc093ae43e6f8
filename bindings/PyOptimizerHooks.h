#pragma once
// The Python side of optim/ExternalOptimizer.h: a torch.optim class stepped by the
// package's _torch_optimizer.TorchShardOptimizer, whose methods become the hooks.
#include <torch/csrc/utils/pybind.h>

#include "optim/ExternalOptimizer.h"

namespace zeroshard {

// Hooks that call `owner`'s methods step(grads, lrs), state_names(), read_state(group,
// arrays), write_state(group, arrays), scalar_state(), set_scalar_state(json, steps) and
// state_bytes(), each with the GIL held; and, where the owner has step_region (an
// optimizer that can step one region at a time: NVMe), step_region(region, grad, lrs,
// arrays) and release_state().
ExternalOptimizerHooks python_optimizer_hooks(pybind11::object owner);

// [(master, [(begin, count, param_group), ...], [(begin, count, param, param_offset,
// shape, name), ...]), ...]: every group's fp32 master, which parameter group each of its spans
// is in, and which parameter each piece is (optim/ExternalOptimizer.h).
pybind11::list optimizer_shards(const ExternalOptimizer& optimizer);

// [(group, offset, numel), ...]: the swap regions with NVMe, in order; empty without.
pybind11::list optimizer_regions(const ExternalOptimizer& optimizer);

}  // namespace zeroshard
