#pragma once
// The config's binding: LoadedConfig, parsed once in C++, and parse_config.
#include <torch/csrc/utils/pybind.h>

namespace zeroshard {

void bind_config(pybind11::module_& m);

}  // namespace zeroshard
