#pragma once
// The config's binding: LoadedConfig, parsed once in C++, and parse_config; and what the
// Python side tells the config besides it.
#include <cstdint>
#include <optional>

#include <torch/csrc/utils/pybind.h>

namespace zeroshard {

void bind_config(pybind11::module_& m);

// A Megatron mpu's `size` (0 or 1: none; bindings/zeroshard/_parallel/tensor_parallel.py) fills the
// config's `key` (`configured`) where the config leaves it out or at 1; a contradiction is
// an error naming both. `what`: "tensor-parallel", "pipeline-parallel".
void take_mpu_size(std::optional<int64_t>& configured, int size, const char* key, const char* what);

}  // namespace zeroshard
