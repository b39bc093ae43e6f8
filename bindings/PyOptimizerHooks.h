#pragma once
// The Python side of engine/ExternalOptimizer.h: a torch.optim class stepped by the
// package's _torch_optimizer.TorchShardOptimizer, whose methods become the hooks.
#include <torch/csrc/utils/pybind.h>

#include "engine/ExternalOptimizer.h"

namespace zeroshard {

// Hooks that call `owner`'s methods step(grads, lrs), state_names(), read_state(group,
// arrays), write_state(group, arrays), scalar_state(), set_scalar_state(json, steps) and
// state_bytes(), each with the GIL held.
ExternalOptimizerHooks python_optimizer_hooks(pybind11::object owner);

// [(master, [(begin, count, param_group), ...], [(begin, count, param, param_offset,
// shape, name), ...]), ...]: every group's fp32 master, which parameter group each of its spans
// is in, and which parameter each piece is (engine/ExternalOptimizer.h).
pybind11::list optimizer_shards(const ExternalOptimizer& optimizer);

}  // namespace zeroshard
