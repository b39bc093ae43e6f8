#include "bindings/PyOptimizerHooks.h"

#include <memory>

#include <pybind11/stl.h>

namespace py = pybind11;

namespace zeroshard {
namespace {

// The owner, released with the GIL held whichever thread drops the last hook.
struct Owner {
  explicit Owner(py::object o) : object(std::move(o)) {}
  ~Owner() {
    py::gil_scoped_acquire gil;
    object = py::object();
  }
  py::object object;
};

}  // namespace

ExternalOptimizerHooks python_optimizer_hooks(py::object owner_object) {
  auto owner = std::make_shared<Owner>(std::move(owner_object));
  ExternalOptimizerHooks h;
  h.step = [owner](const std::vector<at::Tensor>& grads, const std::vector<AdamHyper>& hypers) {
    py::gil_scoped_acquire gil;
    std::vector<double> lrs;
    for (const auto& hyper : hypers) lrs.push_back(hyper.lr);
    owner->object.attr("step")(grads, lrs);
  };
  h.state_names = [owner] {
    py::gil_scoped_acquire gil;
    return owner->object.attr("state_names")().cast<std::vector<std::string>>();
  };
  h.read_state = [owner](size_t group, const std::vector<at::Tensor>& arrays) {
    py::gil_scoped_acquire gil;
    owner->object.attr("read_state")(group, arrays);
  };
  h.write_state = [owner](size_t group, const std::vector<at::Tensor>& arrays) {
    py::gil_scoped_acquire gil;
    owner->object.attr("write_state")(group, arrays);
  };
  h.scalar_state = [owner] {
    py::gil_scoped_acquire gil;
    return owner->object.attr("scalar_state")().cast<std::string>();
  };
  h.set_scalar_state = [owner](const std::string& json, int64_t steps) {
    py::gil_scoped_acquire gil;
    owner->object.attr("set_scalar_state")(json, steps);
  };
  h.state_bytes = [owner] {
    py::gil_scoped_acquire gil;
    return owner->object.attr("state_bytes")().cast<int64_t>();
  };
  if (!py::hasattr(owner->object, "step_region")) return h;  // steps whole parameters only
  h.release_state = [owner] {
    py::gil_scoped_acquire gil;
    owner->object.attr("release_state")();
  };
  h.step_region = [owner](size_t region, const at::Tensor& grad,
                          const std::vector<AdamHyper>& hypers,
                          const std::vector<at::Tensor>& arrays) {
    py::gil_scoped_acquire gil;
    std::vector<double> lrs;
    for (const auto& hyper : hypers) lrs.push_back(hyper.lr);
    owner->object.attr("step_region")(region, grad, lrs, arrays);
  };
  return h;
}

py::list optimizer_shards(const ExternalOptimizer& optimizer) {
  py::list out;
  for (size_t g = 0; g < optimizer.groups(); ++g) {
    py::list spans;
    for (const HyperSpan& s : optimizer.spans(g))
      spans.append(py::make_tuple(s.begin, s.count, s.group));
    if (optimizer.spans(g).empty())  // one parameter group: the whole shard is in group 0
      spans.append(py::make_tuple(0, optimizer.group_numel(g), 0));
    py::list pieces;  // (begin, count, param, param_offset, shape, name)
    if (g < optimizer.piece_groups()) {
      for (const ParamPiece& p : optimizer.pieces(g))
        pieces.append(py::make_tuple(p.begin, p.count, p.param, p.param_offset, p.shape, p.name));
    }
    out.append(py::make_tuple(optimizer.masters()[g], spans, pieces));
  }
  return out;
}

py::list optimizer_regions(const ExternalOptimizer& optimizer) {
  py::list out;
  for (const StateRegion& r : optimizer.regions())
    out.append(py::make_tuple(r.group, r.offset, r.numel));
  return out;
}

}  // namespace zeroshard
