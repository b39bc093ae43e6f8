// The pybind11 module zeroshard._zeroshard: argument conversion only. Everything the
// Python package does goes through zeroshard::Engine, the Config loader and the Planner.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>
#include <map>
#include <set>
#include <tuple>

#include "bindings/PyActivations.h"
#include "bindings/PyConfig.h"
#include "bindings/PyOptimizerHooks.h"
#include "bindings/PyPlan.h"
#include "common/Bytes.h"
#include "common/Error.h"
#include "common/InterpreterLock.h"
#include "config/Config.h"
#include "engine/EngineImpl.h"
#include "engine/NcclGroup.h"
#include "engine/ProcessGroupSetup.h"
#include "offload/ActivationStore.h"
#include "plan/HfConfig.h"

namespace py = pybind11;
using namespace zeroshard;

namespace {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

std::vector<NamedParam> to_params(const NamedTensors& in) {
  std::vector<NamedParam> out;
  for (const auto& [name, t] : in) out.push_back({name, t});
  return out;
}

// {tier: {"current", "peak", "predicted", "kinds": {kind: {"current", "peak",
// "predicted"}}}} in bytes; a tier's peak is the peak of its sum.
py::dict memory_dict(const MemoryDetail& r) {
  py::dict tiers;
  for (size_t t = 0; t < kNumTiers; ++t) {
    const auto tier = static_cast<Tier>(t);
    py::dict kinds;
    for (size_t k = 0; k < kNumKinds; ++k) {
      py::dict v;
      v["current"] = r.measured.current[t][k];
      v["peak"] = r.measured.peak[t][k];
      v["predicted"] = r.predicted.at(tier, static_cast<Kind>(k));
      kinds[kind_name(static_cast<Kind>(k))] = v;
    }
    py::dict entry;
    entry["current"] = r.measured.current_total(tier);
    entry["peak"] = r.measured.tier_peaks[t];
    entry["predicted"] = r.predicted.total(tier);
    entry["kinds"] = kinds;
    tiers[tier_name(tier)] = entry;
  }
  py::dict device = tiers[tier_name(Tier::Device)];
  device["capacity"] = r.device_capacity;
  if (r.allocator) {  // torch.cuda's memory_allocated, max_memory_allocated, max_memory_reserved
    py::dict a;
    a["allocated"] = r.allocator->allocated;
    a["peak_allocated"] = r.allocator->peak_allocated;
    a["peak_reserved"] = r.allocator->peak_reserved;
    device["allocator"] = a;
  }
  return tiers;
}

// A parameter group's hyperparameters as the package passes them: {"lr", "betas",
// "eps", "weight_decay", "decoupled", "bias_correction"}, each optional.
ParamGroupOptions to_group_options(const py::dict& d) {
  ParamGroupOptions o;
  for (const auto& [key, value] : d) {
    const std::string k = py::str(key);
    if (k == "lr") {
      o.lr = value.cast<double>();
    } else if (k == "betas") {
      const auto betas = value.cast<std::pair<double, double>>();
      o.beta1 = betas.first;
      o.beta2 = betas.second;
    } else if (k == "eps") {
      o.eps = value.cast<double>();
    } else if (k == "weight_decay") {
      o.weight_decay = value.cast<double>();
    } else if (k == "decoupled") {
      o.decoupled = value.cast<bool>();
    } else if (k == "bias_correction") {
      o.bias_correction = value.cast<bool>();
    } else {
      fail(
          "parameter group key '{}' is not known here; allowed: lr, betas, eps, weight_decay, "
          "decoupled, bias_correction",
          k);
    }
  }
  return o;
}

py::dict hyper_dict(const AdamHyper& h) {
  py::dict d;
  d["lr"] = h.lr;
  d["betas"] = py::make_tuple(h.beta1, h.beta2);
  d["eps"] = h.eps;
  d["weight_decay"] = h.weight_decay;
  d["decoupled"] = h.decoupled;
  d["bias_correction"] = h.bias_correction;
  return d;
}

using GroupsArg = std::vector<std::pair<std::vector<at::Tensor>, py::dict>>;
using BuffersArg =
    std::vector<std::tuple<std::string, at::Tensor, bool>>;  // name, tensor, persistent

// (Hugging Face config as JSON, attn_implementation, sequence length, where it came from,
// gradient checkpointing): see engine/EnginePlan.h AssumedBatch.
using AssumedBatchArg =
    std::optional<std::tuple<std::string, std::string, int64_t, std::string, bool>>;

// A family the estimator does not read leaves the plan without activations (its reason
// says so), as memory_report's prediction does (bindings/zeroshard/_activations/shapes.py).
// `tensor_parallel`: one rank's heads and widths (plan/ModelSpec.h TransformerArch).
std::optional<AssumedBatch> to_assumed_batch(const AssumedBatchArg& arg, int64_t tensor_parallel) {
  if (!arg) return std::nullopt;
  const auto& [json, attn, seq, source, checkpointing] = *arg;
  AssumedBatch batch;
  try {
    batch.shaped = spec_from_hf_model(json, attn, tensor_parallel);
  } catch (const Error&) {
    return std::nullopt;
  }
  batch.seq = seq;
  batch.source = source;
  batch.activation_checkpointing = checkpointing;
  return batch;
}

// No call into the engine that may issue or wait on a collective holds the GIL. A
// collective's work keeps its tensors until Gloo's worker thread drops them, and a tensor
// whose storage Python owns (weights a safetensors file maps: from_pretrained) needs the GIL
// to be freed there. Holding it while the next collective waits for that thread is a
// deadlock: two ranks loading pretrained weights hung in the initial broadcast. The engine
// is also destroyed without it, since its threads may be finishing such work.
struct DeleteWithoutGil {
  void operator()(EngineImpl* engine) const {
    py::gil_scoped_release release;
    delete engine;
  }
};
using EngineHolder = std::unique_ptr<EngineImpl, DeleteWithoutGil>;

EngineHolder make_engine(
    const NamedTensors& params, const std::vector<NamedTensors>& units, LoadedConfig loaded,
    const GroupsArg& groups, bool store_served, const py::object& materialize,
    const BuffersArg& buffers, const std::string& optimizer_type, int64_t optimizer_state_bytes,
    bool optimizer_elementwise, std::pair<int64_t, int64_t> optimizer_state_other,
    const AssumedBatchArg& assumed_batch, int tensor_parallel_size,
    const std::map<std::string, int>& tensor_parallel_params, int pipeline_parallel_size,
    const std::set<std::string>& quantizable_params, int sequence_parallel_size,
    int expert_parallel_size, const std::set<std::string>& expert_params, bool ring_attention) {
  loaded.config.expert_parallel_size = std::max(1, expert_parallel_size);
  loaded.config.ring_attention = ring_attention;
  take_mpu_size(loaded.config.pipeline_parallel_size, pipeline_parallel_size, "pipeline.stages",
                "pipeline-parallel");
  take_mpu_size(loaded.config.sequence_parallel_size, sequence_parallel_size,
                "sequence_parallel_size", "sequence-parallel");
  take_mpu_size(loaded.config.tensor_parallel_size, tensor_parallel_size,
                "tensor_parallel.autotp_size", "tensor-parallel");
  if (!optimizer_type.empty()) {  // a client optimizer object or a config's torch.optim type
    OptimizerConfig& o = loaded.config.optimizer;
    o.type = optimizer_type;
    o.external = true;
    o.state_bytes = optimizer_state_bytes;
    o.elementwise = optimizer_elementwise;
    std::tie(o.state_whole_bytes, o.state_sharded_bytes) = optimizer_state_other;
    check_contradictions(loaded.config);
  }
  std::vector<std::vector<NamedParam>> unit_params;
  for (const auto& u : units) unit_params.push_back(to_params(u));
  std::vector<ParamGroup> param_groups;
  for (const auto& [tensors, options] : groups)
    param_groups.push_back({tensors, to_group_options(options)});
  LaunchEnv launch = read_launch_env();
  launch.agent_store = launch.agent_store || store_served;
  MaterializeParams fill;
  if (!materialize.is_none()) {
    fill = [&materialize](const std::vector<NamedParam>& group) {
      py::gil_scoped_acquire gil;
      std::vector<at::Tensor> tensors;
      for (const auto& p : group) tensors.push_back(p.param);
      materialize(tensors);
    };
  }
  std::vector<NamedBuffer> named_buffers;
  for (const auto& [name, tensor, persistent] : buffers)
    named_buffers.push_back({name, tensor, persistent});
  std::vector<NamedParam> named = to_params(params);
  const auto split_dim = [&](const std::string& name) {
    const auto it = tensor_parallel_params.find(name);
    return it == tensor_parallel_params.end() ? -1 : it->second;
  };
  const auto mark = [&](NamedParam& p) {
    p.tensor_parallel_dim = split_dim(p.name);
    p.quantizable = quantizable_params.count(p.name) > 0;
    p.expert = expert_params.count(p.name) > 0;
  };
  for (auto& p : named) mark(p);
  for (auto& unit : unit_params)
    for (auto& p : unit) mark(p);
  std::optional<AssumedBatch> batch =
      to_assumed_batch(assumed_batch, loaded.config.tensor_parallel_size.value_or(1));
  // Construction issues collectives (the initial broadcast, the agreement of what every rank
  // built): never with the GIL held (see EngineHolder).
  py::gil_scoped_release release;
  return EngineHolder(new EngineImpl(std::move(named), unit_params, loaded.config, launch,
                                     std::move(param_groups), fill, std::move(named_buffers),
                                     batch));
}

}  // namespace

PYBIND11_MODULE(_zeroshard, m) {
  m.doc() = "zeroshard's C++ runtime (use the zeroshard package, not this module)";
  set_interpreter_lock_probe([] { return PyGILState_Check() == 1; });
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::set_error(error, e.what());
    }
  });

  bind_config(m);
  m.def(
      "engine_serves_rendezvous", [] { return engine_serves_rendezvous(read_launch_env()); },
      "True when an earlier engine of this process met the others in the rendezvous store "
      "that rank 0's process serves and keeps (engine/ProcessGroupSetup.h).");
  m.def(
      "launch_env",
      [] {
        const LaunchEnv env = read_launch_env();
        py::dict d;
        d["rank"] = env.rank;
        d["world_size"] = env.world_size;
        d["local_rank"] = env.local_rank;
        d["master_addr"] = env.master_addr;
        d["master_port"] = env.master_port;
        d["launcher"] = env.launcher;
        return d;
      },
      "The rank, world size and rendezvous address the engine will use (torchrun, srun or "
      "mpirun variables).");
  m.def("parse_bytes", &parse_bytes, py::arg("text"), py::arg("what"),
        "\"80GB\" (10^9), \"1.5TiB\" (2^40), \"4096\": the CLI's size parser");
  m.def("gpu_unavailable", &why_no_gpu,
        "Why a model on a GPU cannot train here, in one sentence (\"\" when it can): no CUDA "
        "in the build, its GPU half not loading beside this torch, or no device visible");

  bind_plan(m);
  bind_activation_store(m);

  py::class_<EngineImpl, EngineHolder>(m, "Engine")
      .def(py::init(&make_engine), py::arg("params"), py::arg("units"), py::arg("config"),
           py::arg("param_groups") = GroupsArg{},
           // torch.distributed, initialised in this process, serves the store at
           // MASTER_ADDR:MASTER_PORT: join it rather than listen there again.
           py::arg("store_served") = false,
           // Called with each group's parameters before the engine copies them: brings
           // parameters built sharded (zeroshard.init) back whole, one group at a time.
           py::arg("materialize") = py::none(),
           // (name, tensor, persistent) of every buffer, kept in step across ranks.
           py::arg("buffers") = BuffersArg{},
           // A torch.optim class the package steps on the shards (its name) and the bytes
           // per element of its state; empty: zeroshard's own Adam/AdamW.
           py::arg("optimizer_type") = "", py::arg("optimizer_state_bytes") = 8,
           // Whether it steps any part of the shards on its own (its state paged from NVMe).
           py::arg("optimizer_elementwise") = true,
           // (bytes held whole by every rank, bytes sharded) of state that is not per
           // element (config/Config.h).
           py::arg("optimizer_state_other") = std::pair<int64_t, int64_t>{0, 0},
           // The batch offload_optimizer.ratio auto leaves room for (engine/EnginePlan.h).
           py::arg("assumed_batch") = py::none(),
           // A Megatron mpu's tensor-parallel size (0: the config's), the names of the
           // parameters split across its ranks, its pipeline-parallel size (0: the config's).
           py::arg("tensor_parallel_size") = 0,
           py::arg("tensor_parallel_params") = std::map<std::string, int>{},
           py::arg("pipeline_parallel_size") = 0,
           py::arg("quantizable_params") = std::set<std::string>{},
           // An mpu of Ulysses' groups: its sequence-parallel size (0: the config's).
           py::arg("sequence_parallel_size") = 0,
           // The MoE layers' ep_size and the names of their experts' parameters, split
           // across the expert-parallel ranks (include/zeroshard/Types.h NamedParam::expert).
           py::arg("expert_parallel_size") = 1, py::arg("expert_params") = std::set<std::string>{},
           // The sequence-parallel ranks are a mesh's cp dimension: torch's ring attention.
           py::arg("ring_attention") = false)
      .def("optimizer_shards",
           [](EngineImpl& e) { return optimizer_shards(e.external_optimizer()); })
      .def("optimizer_regions",
           [](EngineImpl& e) { return optimizer_regions(e.external_optimizer()); })
      .def(
          "reduce_across_shards",
          [](EngineImpl& e, at::Tensor tensor) { e.reduce_across_shards(tensor); },
          py::call_guard<py::gil_scoped_release>())
      .def("set_optimizer_hooks",
           [](EngineImpl& e, py::object owner) {
             e.external_optimizer().set_hooks(python_optimizer_hooks(std::move(owner)));
           })
      .def("set_param_group",
           [](EngineImpl& e, size_t group, const py::dict& options) {
             e.set_param_group(group, to_group_options(options));
           })
      .def("param_group_hypers",
           [](const EngineImpl& e) {
             py::list out;
             for (const auto& h : e.param_group_hypers()) out.append(hyper_dict(h));
             return out;
           })
      .def("unit_forward_begin", &EngineImpl::unit_forward_begin,
           py::call_guard<py::gil_scoped_release>())
      .def("unit_forward_end", &EngineImpl::unit_forward_end,
           py::call_guard<py::gil_scoped_release>())
      .def("unit_backward_begin", &EngineImpl::unit_backward_begin,
           py::call_guard<py::gil_scoped_release>())
      .def("unit_inputs_need_grad", &EngineImpl::unit_inputs_need_grad)
      .def("unit_inputs_done", &EngineImpl::unit_inputs_done,
           py::call_guard<py::gil_scoped_release>())
      .def("model_forward_begin", &EngineImpl::model_forward_begin,
           py::call_guard<py::gil_scoped_release>())
      .def("model_forward_end", &EngineImpl::model_forward_end,
           py::call_guard<py::gil_scoped_release>())
      .def("touch_unit", &EngineImpl::touch_unit, py::call_guard<py::gil_scoped_release>())
      .def("unit_held", &EngineImpl::unit_held)
      .def("gather_unit", &EngineImpl::gather_unit, py::call_guard<py::gil_scoped_release>())
      .def("release_unit", &EngineImpl::release_unit, py::call_guard<py::gil_scoped_release>())
      .def("commit_parameters", &EngineImpl::commit_parameters,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "save_checkpoint",
          [](EngineImpl& e, const std::string& dir, const std::string& tag,
             const std::string& client_state_json, const std::string& lr_scheduler_json,
             bool latest, bool frozen_parameters) {
            return e.save_checkpoint(dir, tag, client_state_json, lr_scheduler_json,
                                     SaveOptions{latest, frozen_parameters});
          },
          py::arg("dir"), py::arg("tag"), py::arg("client_state_json"),
          py::arg("lr_scheduler_json"), py::arg("latest") = true,
          py::arg("frozen_parameters") = true, py::call_guard<py::gil_scoped_release>())
      // (client_state JSON, lr_scheduler JSON)
      .def(
          "load_checkpoint",
          [](EngineImpl& e, const std::string& dir, const std::string& tag, bool strict,
             bool optimizer_states, bool lr_scheduler, bool module_only) {
            LoadedCheckpoint loaded;
            {
              py::gil_scoped_release release;
              loaded = e.load_checkpoint(
                  dir, tag, LoadOptions{strict, optimizer_states, lr_scheduler, module_only});
            }
            return py::make_tuple(loaded.client_state_json, loaded.lr_scheduler_json);
          },
          py::arg("dir"), py::arg("tag"), py::arg("strict") = true,
          py::arg("optimizer_states") = true, py::arg("lr_scheduler") = true,
          py::arg("module_only") = false)
      .def("set_aliases", &EngineImpl::set_aliases)
      .def("backward", &EngineImpl::backward, py::arg("loss"), py::arg("retain_graph") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("begin_backward", &EngineImpl::begin_backward, py::arg("loss"),
           py::call_guard<py::gil_scoped_release>())
      .def("end_backward", &EngineImpl::end_backward, py::call_guard<py::gil_scoped_release>())
      .def("begin_input_backward", &EngineImpl::begin_input_backward, py::arg("loss"),
           py::call_guard<py::gil_scoped_release>())
      .def("end_input_backward", &EngineImpl::end_input_backward,
           py::call_guard<py::gil_scoped_release>())
      .def("begin_weight_backward", &EngineImpl::begin_weight_backward,
           py::call_guard<py::gil_scoped_release>())
      .def("end_weight_backward", &EngineImpl::end_weight_backward,
           py::call_guard<py::gil_scoped_release>())
      .def("keep_units_gathered_in_step", &EngineImpl::keep_units_gathered_in_step)
      .def("reduce_once_per_step", &EngineImpl::reduce_once_per_step)
      .def("set_pipeline_stages_on_rank", &EngineImpl::set_pipeline_stages_on_rank,
           py::arg("stages"))
      .def("step", &EngineImpl::step, py::call_guard<py::gil_scoped_release>())
      .def("zero_grad", &EngineImpl::zero_grad, py::call_guard<py::gil_scoped_release>())
      .def("full_parameters",
           [](EngineImpl& e) {
             std::vector<NamedParam> full;
             {
               py::gil_scoped_release release;  // stage 3 gathers every unit
               full = e.full_parameters();
             }
             NamedTensors out;
             for (auto& p : full) out.emplace_back(p.name, p.param);
             return out;
           })
      .def_property_readonly("loss_scale", &EngineImpl::loss_scale)
      .def_property_readonly("global_grad_norm", &EngineImpl::global_grad_norm)
      .def_property_readonly("lr", &EngineImpl::lr)
      .def_property_readonly("optimizer_steps", &EngineImpl::optimizer_steps)
      .def_property_readonly("global_steps", &EngineImpl::global_steps)
      .def_property_readonly("skipped_steps", &EngineImpl::skipped_steps)
      .def_property_readonly("schedule_steps", &EngineImpl::schedule_steps)
      .def_property_readonly("micro_steps", &EngineImpl::micro_steps)
      .def(
          "ends_accumulation",
          [](const EngineImpl& e, int64_t micro_steps) {
            return e.plan().settings.ends_accumulation(micro_steps);
          },
          py::arg("micro_steps"),
          "Whether the micro_steps-th micro-batch (from 1) ends an accumulation window.")
      .def_property_readonly("rank", &EngineImpl::rank)
      .def_property_readonly("world_size", &EngineImpl::world_size)
      .def_property_readonly("data_parallel_rank", &EngineImpl::data_parallel_rank)
      .def_property_readonly("data_parallel_size", &EngineImpl::data_parallel_size)
      .def_property_readonly("sequence_parallel_size", &EngineImpl::sequence_parallel_size)
      .def_property_readonly("tensor_parallel_size", &EngineImpl::tensor_parallel_size)
      .def_property_readonly("pipeline_parallel_size", &EngineImpl::pipeline_parallel_size)
      .def_property_readonly("pipeline_stage", &EngineImpl::pipeline_stage)
      .def_property_readonly("stage",
                             [](const EngineImpl& e) { return e.plan().settings.stage.number(); })
      .def_property_readonly(
          "shards_optimizer",
          [](const EngineImpl& e) { return e.plan().settings.stage.shards_optimizer(); })
      .def_property_readonly(
          "shards_parameters",
          [](const EngineImpl& e) { return e.plan().settings.stage.shards_parameters(); })
      .def_property_readonly(
          "gradient_accumulation_steps",
          [](const EngineImpl& e) { return e.plan().settings.gradient_accumulation_steps; })
      .def_property_readonly(
          "micro_batch_size",
          [](const EngineImpl& e) { return *e.config().train_micro_batch_size_per_gpu; })
      .def_property_readonly(
          "gradient_clipping",
          [](const EngineImpl& e) { return e.plan().settings.gradient_clipping; })
      .def_property_readonly(
          "bf16", [](const EngineImpl& e) { return e.plan().settings.compute == Precision::Bf16; })
      .def_property_readonly("dataloader_drop_last",
                             [](const EngineImpl& e) { return e.config().dataloader_drop_last; })
      .def_property_readonly("fp16",
                             [](const EngineImpl& e) { return e.plan().settings.fp16.enabled; })
      .def_property_readonly(
          "scheduled",
          [](const EngineImpl& e) { return e.plan().settings.scheduler.type != "none"; })
      .def_property_readonly("plan_label",
                             [](const EngineImpl& e) { return e.plan().option.label(); })
      .def_property_readonly("plan_reasons", [](const EngineImpl& e) { return e.plan().reasons; })
      .def_property_readonly("config_yaml",
                             [](const EngineImpl& e) { return emit_config_yaml(e.config()); })
      .def("memory_report", [](const EngineImpl& e) { return memory_dict(e.memory_detail()); })
      .def("activation_store", &EngineImpl::activation_store,
           "Where activation_checkpointing.offload keeps saved activations (made at the first "
           "call).")
      .def("set_pipeline_in_flight", &EngineImpl::set_pipeline_in_flight, py::arg("in_flight"),
           py::arg("micro_batches"))
      .def("set_activation_shape", &EngineImpl::set_activation_shape, py::arg("hf_config_json"),
           py::arg("attn_implementation"), py::arg("seq"), py::arg("micro_batch"),
           py::arg("activation_checkpointing"), py::arg("has_head") = true)
      .def(
          "recomputed_layers",
          [](const EngineImpl& e) -> py::object {
            const auto r = e.recomputed_layers();
            if (!r) return py::none();
            return py::make_tuple(r->whole, r->ops);
          },
          "(whole, ops): the layers activation_checkpointing.mode recomputes at the batch "
          "set_activation_shape described; None before one.")
      .def(
          "set_expert_names",
          [](EngineImpl& e, std::unordered_map<std::string, std::vector<std::string>> renamed,
             std::vector<std::string> stacked) {
            e.set_expert_names({std::move(renamed), {stacked.begin(), stacked.end()}});
          },
          py::arg("renamed"), py::arg("stacked"),
          "Expert parallelism, what checkpoints save split experts as (engine/Checkpointer.h "
          "ExpertNames): {parameter: [its name on each ep coordinate]} for DeepSpeed's layer, "
          "and the fused experts each coordinate holds rows of (saved as parts of the whole).")
      .def("bytes_sent", &EngineImpl::bytes_sent)
      .def("barrier", &EngineImpl::barrier, py::call_guard<py::gil_scoped_release>());
}
