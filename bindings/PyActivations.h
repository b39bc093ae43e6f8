#pragma once
// The bindings of offload/ActivationStore.h, the engine's activation_store()
// (bindings/zeroshard/_activations/offload.py moves the saved activations through it).
#include <torch/csrc/utils/pybind.h>

namespace zeroshard {

void bind_activation_store(pybind11::module_& m);

}  // namespace zeroshard
