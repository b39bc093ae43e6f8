// The Planner's bindings: stage-3 units of a module tree, and a plan for a live model
// (zeroshard.estimate), training or serving.
#include "bindings/PyPlan.h"

#include <pybind11/stl.h>
#include <map>
#include <string>
#include <tuple>

#include "common/Error.h"
#include "config/Config.h"
#include "engine/UnitPartition.h"
#include "plan/HfConfig.h"
#include "plan/Planner.h"
#include "plan/ServingStream.h"

namespace py = pybind11;

namespace zeroshard {
namespace {

// {"device", "host_link", "nvme"}: bytes per second; any left out keeps its default.
Bandwidths bandwidths_of(const std::map<std::string, double>& given) {
  Bandwidths b;
  for (const auto& [name, rate] : given) {
    double* field = name == "device"      ? &b.device
                    : name == "host_link" ? &b.host_link
                    : name == "nvme"      ? &b.nvme
                                          : nullptr;
    if (field == nullptr)
      fail("bandwidths: '{}' is not allowed; allowed: device, host_link, nvme", name);
    if (!(rate > 0))
      fail("bandwidths['{}']: {} is not allowed; allowed: bytes per second > 0", name, rate);
    *field = rate;
  }
  return b;
}

py::dict stream_dict(const ModelSpec& spec, const PlanOption& option, const Config& config,
                     const WorldShape& world, const TrainingShape& shape, const Bandwidths& rates) {
  const ServingStream st = serving_stream(spec, option, config, world, shape, rates);
  py::dict d;
  d["weights"] = tier_name(st.weights);
  d["kv_cache"] = option.kv_cache_on_host ? "host" : "device";
  d["device_bytes_per_step"] = st.device_bytes;
  d["host_bytes_per_step"] = st.host_bytes;
  d["nvme_bytes_per_step"] = st.nvme_bytes;
  d["seconds_per_step"] = st.seconds_per_step;
  d["tokens_per_second_per_rank"] = st.tokens_per_second;
  d["bound_by"] = st.bound_by;
  return d;
}

}  // namespace

void bind_plan(py::module_& m) {
  m.def(
      "partition_units",
      [](const std::vector<std::tuple<std::vector<size_t>, std::vector<size_t>, bool, bool>>& nodes,
         size_t param_count, const std::vector<size_t>& declared) {
        std::vector<ModuleNode> tree;
        for (const auto& [children, params, stack, callable] : nodes)
          tree.push_back({children, params, stack, callable});
        py::list out;
        for (const UnitNodes& u : partition_units(tree, param_count, declared))
          out.append(py::make_tuple(u.modules, u.params));
        return out;
      },
      py::arg("nodes"), py::arg("param_count"), py::arg("declared"),
      "Stage-3 units of a module tree (engine/UnitPartition.h): nodes are (children, "
      "parameters, stack, callable); returns (modules, parameters) per unit.");
  m.def(
      "plan",
      [](int64_t total_params, const std::vector<int64_t>& unit_params,
         int64_t largest_module_params, const LoadedConfig& loaded, int nodes, int ranks_per_node,
         int64_t device_bytes, int64_t host_bytes, int64_t nvme_bytes,
         const std::string& hf_config_json, const std::string& attn_implementation, int64_t seq,
         int64_t micro_batch, bool activation_checkpointing, int64_t tensor_parallel,
         bool inference, const std::map<std::string, double>& bandwidths) {
        TrainingShape shape;
        shape.seq = seq;
        shape.micro_batch = micro_batch;
        shape.activation_checkpointing = activation_checkpointing;
        shape.inference = inference;
        ModelSpec spec;
        spec.source = "python";
        spec.model_type = "module";
        spec.total_params = total_params;
        spec.unit_params = unit_params;
        spec.largest_module_params = largest_module_params;
        if (!hf_config_json.empty()) {  // activations from the model's own config
          take_shape(spec,
                     spec_from_hf_model(hf_config_json, attn_implementation, tensor_parallel));
        }
        Config config = loaded.config;
        Bandwidths rates;
        if (inference) {  // served as zeroshard.init_inference serves it
          spec.unit_frozen.assign(spec.unit_params.size(), true);
          config.zero.stage = 3;
          rates = bandwidths_of(bandwidths);
        }
        HardwareBudget budget;
        budget.device_bytes = device_bytes;
        budget.host_bytes = host_bytes;
        budget.nvme_bytes = nvme_bytes;
        const WorldShape world{nodes, ranks_per_node, tensor_parallel};
        const Plan plan = make_plan(spec, config, world, shape, budget);
        py::list options;
        for (const auto& o : plan.options) {
          py::dict d;
          d["option"] = o.option.label();
          d["allowed"] = o.allowed;
          d["fits"] = o.fits;
          d["verdict"] = o.verdict;
          py::dict per_tier;
          for (size_t t = 0; t < kNumTiers; ++t)
            per_tier[tier_name(static_cast<Tier>(t))] = o.bytes.total(static_cast<Tier>(t));
          d["bytes_per_rank"] = per_tier;
          d["activation_bytes"] = o.bytes.at(Tier::Device, Kind::Activations);
          if (inference)
            d["stream"] = stream_dict(spec, o.option, plan.config, world, shape, rates);
          options.append(d);
        }
        py::dict out;
        out["summary"] = plan.summary;
        out["fits"] = plan.fits;
        out["recommended"] = plan.option.label();
        out["reasons"] = plan.reasons;
        out["options"] = options;
        out["config_yaml"] = emit_config_yaml(plan.config);
        if (inference)
          out["kv_cache_bytes"] = kv_cache_bytes(spec, shape, plan.config.compute_bytes());
        return out;
      },
      py::arg("total_params"), py::arg("unit_params"), py::arg("largest_module_params"),
      py::arg("config"), py::arg("nodes"), py::arg("ranks_per_node"), py::arg("device_bytes"),
      py::arg("host_bytes"), py::arg("nvme_bytes"), py::arg("hf_config_json") = "",
      py::arg("attn_implementation") = "sdpa", py::arg("seq") = 1, py::arg("micro_batch") = 1,
      py::arg("activation_checkpointing") = false, py::arg("tensor_parallel") = 1,
      py::arg("inference") = false, py::arg("bandwidths") = std::map<std::string, double>{});
}

}  // namespace zeroshard
