#include "bindings/PyActivations.h"

#include <ATen/ATen.h>

#include "offload/ActivationStore.h"

namespace py = pybind11;

namespace zeroshard {
namespace {

// The block's bytes as a 1-D uint8 CPU tensor; the tensor keeps the block alive.
at::Tensor as_tensor(const std::shared_ptr<HostBlock>& block) {
  auto keep = new std::shared_ptr<HostBlock>(block);
  return at::from_blob(
      block->data(), {block->bytes()}, [keep](void*) { delete keep; },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

}  // namespace

void bind_activation_store(py::module_& m) {
  py::class_<HostBlock, std::shared_ptr<HostBlock>>(
      m, "ActivationHostBlock", "Host memory holding one saved activation's bytes, counted.")
      .def("tensor", &as_tensor, "Its bytes as a uint8 tensor (which keeps it alive).")
      .def_property_readonly("bytes", &HostBlock::bytes);
  py::class_<NvmeBlock, std::shared_ptr<NvmeBlock>>(
      m, "ActivationNvmeBlock", "One saved activation's bytes in the store's swap file.")
      .def("written", &NvmeBlock::written, py::call_guard<py::gil_scoped_release>(),
           "Waits for the write; the host block it was written from is released.")
      .def("fetch", &NvmeBlock::fetch, py::call_guard<py::gil_scoped_release>(),
           "Starts reading the bytes back (after the write).")
      .def("take", &NvmeBlock::take, py::call_guard<py::gil_scoped_release>(),
           "The bytes in a host block, once read.")
      .def_property_readonly("bytes", &NvmeBlock::bytes);
  py::class_<ActivationStore, std::shared_ptr<ActivationStore>>(
      m, "ActivationStore", "offload/ActivationStore.h: where offloaded activations are kept.")
      .def("host", &ActivationStore::host, py::arg("bytes"),
           "A counted host block (a pooled buffer where one fits).")
      .def("write", &ActivationStore::write, py::arg("block"),
           py::call_guard<py::gil_scoped_release>(), "Writes a host block to NVMe, asynchronously.")
      .def("release_pool", &ActivationStore::release_pool, "Frees every pooled host buffer.")
      .def_property_readonly("has_nvme", &ActivationStore::has_nvme)
      .def_property_readonly("file_bytes", &ActivationStore::file_bytes)
      .def_property_readonly("buffers_made", &ActivationStore::buffers_made)
      .def_property_readonly("pooled_bytes", &ActivationStore::pooled_bytes);
}

}  // namespace zeroshard
