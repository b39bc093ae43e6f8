#pragma once
// The toy model the planner's tests size: two units of 3,200 parameters, each one tensor.
#include "plan/MemoryModel.h"

namespace zeroshard::testing {

inline ModelSpec toy_spec() {
  ModelSpec s;
  s.total_params = 6400;
  s.unit_params = {3200, 3200};
  s.largest_module_params = 3200;
  s.tensor_counts = {{3200, 2}};
  return s;
}

}  // namespace zeroshard::testing
