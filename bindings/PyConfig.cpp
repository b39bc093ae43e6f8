#include "bindings/PyConfig.h"

#include <pybind11/stl.h>

#include "common/Error.h"
#include "config/Config.h"
#include "plan/AutoKnobs.h"

namespace py = pybind11;

namespace zeroshard {

void take_mpu_size(std::optional<int64_t>& configured, int size, const char* key,
                   const char* what) {
  if (size <= 1) return;
  if (configured && *configured != 1 && *configured != size) {
    fail(
        "config key '{}' is {}, but the mpu's {} size is {}; allowed: the same size, or leave "
        "the key out",
        key, *configured, what, size);
  }
  configured = size;
}

void bind_config(py::module_& m) {
  // The config crosses from Python once, parsed: every question Python asks of it, and the
  // engine built from it, read this object.
  py::class_<LoadedConfig>(m, "LoadedConfig")
      .def_readonly("origin", &LoadedConfig::origin)
      .def_readonly("warnings", &LoadedConfig::warnings)
      .def_readonly("top_level_keys", &LoadedConfig::top_level_keys,
                    "The keys the config sets at its top level, as written.")
      .def_property_readonly(
          "torch_optimizer",
          [](const LoadedConfig& c) -> py::object {
            const OptimizerConfig& o = c.config.optimizer;
            if (!o.external) return py::none();
            return py::make_tuple(o.type, o.torch_params);
          },
          "(type, {param: its YAML text}) where the config names a torch.optim class, else "
          "None.")
      .def_property_readonly(
          "stage",
          [](const LoadedConfig& c) -> py::object {
            if (!c.config.zero.stage) return py::none();
            return py::int_(*c.config.zero.stage);
          },
          "The config's zero_optimization.stage, or None where it is auto (the Planner's).")
      .def_property_readonly(
          "tensor_parallel_size",
          [](const LoadedConfig& c) { return c.config.tensor_parallel_size.value_or(1); },
          "tensor_parallel.autotp_size: the tp size a model's own tp_plan is applied at.")
      .def_property_readonly(
          "pipeline_parallel_size",
          [](const LoadedConfig& c) { return c.config.pipeline_parallel_size.value_or(1); },
          "pipeline.stages: the pipeline stages the ranks are split into.")
      .def_property_readonly(
          "sequence_parallel_size",
          [](const LoadedConfig& c) { return c.config.sequence_parallel_size.value_or(1); },
          "sequence_parallel_size: the ranks each sequence is split across.")
      .def_property_readonly(
          "comm_timeout_seconds",
          [](const LoadedConfig& c) -> py::object {
            if (!c.config.comm_timeout_seconds) return py::none();
            return py::float_(*c.config.comm_timeout_seconds);
          },
          "comm_timeout_seconds, or None where it is auto (its default, 300).")
      .def_property_readonly(
          "activation_policy",
          [](const LoadedConfig& c) {
            const Config& k = c.config;
            return py::make_tuple(k.activation_checkpointing_mode,
                                  k.selective_ac_option.empty() ? "op" : k.selective_ac_option,
                                  k.activation_memory_budget.value_or(0.5));
          },
          "activation_checkpointing (mode, selective_ac_option, memory_budget), the last two "
          "at their defaults (op, 0.5) where left out.")
      .def_property_readonly(
          "activation_offload",
          [](const LoadedConfig& c) {
            return offload_device_name(c.config.activation_offload.device);
          },
          "activation_checkpointing.offload.device: none, cpu or nvme.")
      .def_property_readonly(
          "autoep",
          [](const LoadedConfig& c) -> py::object {
            const Config::AutoEp& a = c.config.autoep;
            if (!a.enabled) return py::none();
            return py::make_tuple(a.autoep_size.value_or(1), a.preset_model, a.use_grouped_mm);
          },
          "expert_parallel (DeepSpeed's AutoEP) when enabled: (autoep_size, preset_model, "
          "empty for the model's own type, use_grouped_mm); None when off.");
  m.def(
      "resolved_batch",
      [](const LoadedConfig& loaded, int64_t data_parallel_ranks) {
        Config c = loaded.config;
        std::vector<std::string> reasons;
        WorldShape world;
        world.ranks_per_node = data_parallel_ranks;
        resolve_batch(c, world, reasons);
        const int64_t micro = *c.train_micro_batch_size_per_gpu;
        const int64_t accumulation = *c.gradient_accumulation_steps;
        return py::make_tuple(micro * accumulation * data_parallel_ranks, micro, accumulation);
      },
      py::arg("config"), py::arg("data_parallel_ranks"),
      "(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps) over "
      "that many data-parallel ranks, by DeepSpeed's rule; raises Error where they do not fit.");
  m.def("parse_config", &load_config_string, py::arg("text"), py::arg("origin"),
        "Parses a config (YAML or JSON text) once; raises Error on bad input.");
}

}  // namespace zeroshard
