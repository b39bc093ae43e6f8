#pragma once
// The Planner's bindings: partition_units and plan (bindings/zeroshard/_tools/estimate.py).
#include <torch/csrc/utils/pybind.h>

namespace zeroshard {

void bind_plan(pybind11::module_& m);

}  // namespace zeroshard
