#include "config/ConfigSchema.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace zeroshard {
namespace {

constexpr double kBig = 1e15;
constexpr double kInf = std::numeric_limits<double>::infinity();

using IntRef = std::function<std::optional<int64_t>&(Config&)>;
using FloatRef = std::function<std::optional<double>&(Config&)>;

// What every knob has: its path in the config and its type.
Knob base_knob(std::string path, Knob::Type type) {
  Knob k;
  k.path = std::move(path);
  k.type = type;
  return k;
}

Knob int_knob(std::string path, double min, double max, IntRef ref, int64_t multiple_of = 1) {
  Knob k = base_knob(std::move(path), Knob::Type::Int);
  k.min = min;
  k.max = max;
  k.multiple_of = multiple_of;
  k.as_int = std::move(ref);
  return k;
}

Knob float_knob(std::string path, double min, double max, FloatRef ref,
                bool min_exclusive = false) {
  Knob k = base_knob(std::move(path), Knob::Type::Float);
  k.min = min;
  k.max = max;
  k.min_exclusive = min_exclusive;
  k.as_float = std::move(ref);
  return k;
}

Knob floats_knob(std::string path, double min, double max,
                 std::function<std::optional<std::vector<double>>&(Config&)> ref,
                 bool auto_ok = false) {
  Knob k = base_knob(std::move(path), Knob::Type::FloatList);
  k.min = min;
  k.max = max;
  k.auto_ok = auto_ok;
  k.as_floats = std::move(ref);
  return k;
}

Knob bool_knob(std::string path, std::function<bool&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Bool);
  k.auto_ok = false;
  k.as_bool = std::move(ref);
  return k;
}

Knob choice_knob(std::string path, std::vector<std::string> choices,
                 std::function<std::string&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Choice);
  k.auto_ok = false;
  k.choices = std::move(choices);
  k.as_text = std::move(ref);
  return k;
}

Knob text_knob(std::string path, std::function<std::string&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Text);
  k.auto_ok = false;
  k.as_text = std::move(ref);
  return k;
}

Knob offload_knob(std::string path, std::function<OffloadDevice&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Offload);
  k.choices = {"none", "cpu", "nvme"};
  k.as_offload = std::move(ref);
  return k;
}

// zeroshard's own Adam, AdamW and Lamb, then the torch.optim classes it steps.
std::vector<std::string> optimizer_types() {
  std::vector<std::string> types{"AdamW", "Adam", "Lamb"};
  for (const auto& t : torch_optimizer_types()) types.push_back(t);
  return types;
}

std::vector<Knob> build_knobs() {
  const std::string z = "zero_optimization.";
  const std::string oo = z + "offload_optimizer.";
  const std::string sp = "scheduler.params.";
  const std::string wq = "weight_quantization.quantized_initialization.";
  auto fixed = [](Knob k) {  // no auto: DeepSpeed's default stands where the key is left out
    k.auto_ok = false;
    return k;
  };
  const std::string op = z + "offload_param.";
  Knob betas;
  betas.path = "optimizer.params.betas";
  betas.type = Knob::Type::Betas;
  betas.min = 0;
  betas.max = 1;
  betas.as_betas = [](Config& c) { return std::make_pair(&c.optimizer.beta1, &c.optimizer.beta2); };
  // clang-format off
  return {
    int_knob("train_batch_size", 1, kBig, [](Config& c) -> auto& { return c.train_batch_size; }),
    int_knob("train_micro_batch_size_per_gpu", 1, kBig, [](Config& c) -> auto& { return c.train_micro_batch_size_per_gpu; }),
    int_knob("gradient_accumulation_steps", 1, kBig, [](Config& c) -> auto& { return c.gradient_accumulation_steps; }),
    float_knob("gradient_clipping", 0, kInf, [](Config& c) -> auto& { return c.gradient_clipping; }),
    float_knob("comm_timeout_seconds", 0, kInf, [](Config& c) -> auto& { return c.comm_timeout_seconds; }, true),
    choice_knob("communication_data_type", {"fp32", "fp16", "bf16"}, [](Config& c) -> auto& { return c.communication_data_type; }),
    bool_knob("bf16.enabled", [](Config& c) -> auto& { return c.bf16; }),
    bool_knob("fp16.enabled", [](Config& c) -> auto& { return c.fp16.enabled; }),
    float_knob("fp16.loss_scale", 0, kInf, [](Config& c) -> auto& { return c.fp16.loss_scale; }),
    int_knob("fp16.initial_scale_power", 0, 64, [](Config& c) -> auto& { return c.fp16.initial_scale_power; }),
    int_knob("fp16.loss_scale_window", 1, kBig, [](Config& c) -> auto& { return c.fp16.loss_scale_window; }),
    int_knob("fp16.hysteresis", 1, kBig, [](Config& c) -> auto& { return c.fp16.hysteresis; }),
    float_knob("fp16.min_loss_scale", 0, kInf, [](Config& c) -> auto& { return c.fp16.min_loss_scale; }, true),
    choice_knob("optimizer.type", optimizer_types(), [](Config& c) -> auto& { return c.optimizer.type; }),
    float_knob("optimizer.params.lr", 0, kInf, [](Config& c) -> auto& { return c.optimizer.lr; }),
    betas,
    float_knob("optimizer.params.eps", 0, 1, [](Config& c) -> auto& { return c.optimizer.eps; }, true),
    float_knob("optimizer.params.weight_decay", 0, kInf, [](Config& c) -> auto& { return c.optimizer.weight_decay; }),
    bool_knob("optimizer.params.adam_w_mode", [](Config& c) -> auto& { return c.optimizer.adam_w_mode; }),
    bool_knob("optimizer.params.torch_adam", [](Config& c) -> auto& { return c.optimizer.torch_adam; }),
    bool_knob("optimizer.params.bias_correction", [](Config& c) -> auto& { return c.optimizer.bias_correction; }),
    float_knob("optimizer.params.max_coeff", 0, kInf, [](Config& c) -> auto& { return c.optimizer.max_coeff; }),
    float_knob("optimizer.params.min_coeff", 0, kInf, [](Config& c) -> auto& { return c.optimizer.min_coeff; }),
    float_knob("optimizer.params.max_grad_norm", 0, kInf, [](Config& c) -> auto& { return c.optimizer.max_grad_norm; }),
    bool_knob("optimizer.params.eps_inside_sqrt", [](Config& c) -> auto& { return c.optimizer.eps_inside_sqrt; }),
    choice_knob("scheduler.type", {"none", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"}, [](Config& c) -> auto& { return c.scheduler.type; }),
    floats_knob(sp + "warmup_min_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.warmup_min_lr; }, true),
    floats_knob(sp + "warmup_max_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.warmup_max_lr; }, true),
    int_knob(sp + "warmup_num_steps", 1, kBig, [](Config& c) -> auto& { return c.scheduler.warmup_num_steps; }),
    int_knob(sp + "total_num_steps", 1, kBig, [](Config& c) -> auto& { return c.scheduler.total_num_steps; }),
    choice_knob(sp + "warmup_type", {"log", "linear"}, [](Config& c) -> auto& { return c.scheduler.warmup_type; }),
    fixed(float_knob(sp + "warmup_min_ratio", 0, 1, [](Config& c) -> auto& { return c.scheduler.warmup_min_ratio; })),
    fixed(float_knob(sp + "cos_min_ratio", 0, 1, [](Config& c) -> auto& { return c.scheduler.cos_min_ratio; })),
    floats_knob(sp + "cycle_min_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.cycle_min_lr; }),
    floats_knob(sp + "cycle_max_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.cycle_max_lr; }),
    fixed(float_knob(sp + "decay_lr_rate", 0, kInf, [](Config& c) -> auto& { return c.scheduler.decay_lr_rate; })),
    fixed(int_knob(sp + "cycle_first_step_size", 1, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_first_step_size; })),
    fixed(int_knob(sp + "cycle_second_step_size", 0, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_second_step_size; })),
    fixed(int_knob(sp + "cycle_first_stair_count", 0, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_first_stair_count; })),
    fixed(int_knob(sp + "cycle_second_stair_count", 0, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_second_stair_count; })),
    fixed(int_knob(sp + "decay_step_size", 0, kBig, [](Config& c) -> auto& { return c.scheduler.decay_step_size; })),
    bool_knob(sp + "cycle_momentum", [](Config& c) -> auto& { return c.scheduler.cycle_momentum; }),
    floats_knob(sp + "cycle_min_mom", 0, 1, [](Config& c) -> auto& { return c.scheduler.cycle_min_mom; }),
    floats_knob(sp + "cycle_max_mom", 0, 1, [](Config& c) -> auto& { return c.scheduler.cycle_max_mom; }),
    fixed(float_knob(sp + "decay_mom_rate", 0, kInf, [](Config& c) -> auto& { return c.scheduler.decay_mom_rate; })),
    floats_knob(sp + "lr_range_test_min_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.lr_range_test_min_lr; }),
    fixed(int_knob(sp + "lr_range_test_step_size", 1, kBig, [](Config& c) -> auto& { return c.scheduler.lr_range_test_step_size; })),
    fixed(float_knob(sp + "lr_range_test_step_rate", 0, kInf, [](Config& c) -> auto& { return c.scheduler.lr_range_test_step_rate; })),
    bool_knob(sp + "lr_range_test_staircase", [](Config& c) -> auto& { return c.scheduler.lr_range_test_staircase; }),
    fixed(int_knob(sp + "last_batch_iteration", -1, -1, [](Config& c) -> auto& { return c.scheduler.last_batch_iteration; })),
    bool_knob("activation_checkpointing.enabled", [](Config& c) -> auto& { return c.activation_checkpointing; }),
    choice_knob("activation_checkpointing.mode", {"none", "full", "selective", "memory_budget", "auto"}, [](Config& c) -> auto& { return c.activation_checkpointing_mode; }),
    text_knob("activation_checkpointing.selective_ac_option", [](Config& c) -> auto& { return c.selective_ac_option; }),
    fixed(float_knob("activation_checkpointing.memory_budget", 0, 1, [](Config& c) -> auto& { return c.activation_memory_budget; })),
    fixed(offload_knob("activation_checkpointing.offload.device", [](Config& c) -> auto& { return c.activation_offload.device; })),
    text_knob("activation_checkpointing.offload.nvme_path", [](Config& c) -> auto& { return c.activation_offload.nvme_path; }),
    bool_knob("activation_checkpointing.offload.pin_memory", [](Config& c) -> auto& { return c.activation_offload.pin_memory; }),
    bool_knob("broadcast_buffers", [](Config& c) -> auto& { return c.broadcast_buffers; }),
    bool_knob("check_collectives", [](Config& c) -> auto& { return c.check_collectives; }),
    bool_knob("dataloader_drop_last", [](Config& c) -> auto& { return c.dataloader_drop_last; }),
    int_knob(z + "stage", 0, 3, [](Config& c) -> auto& { return c.zero.stage; }),
    bool_knob(z + "overlap_comm", [](Config& c) -> auto& { return c.zero.overlap_comm; }),
    bool_knob(z + "contiguous_gradients", [](Config& c) -> auto& { return c.zero.contiguous_gradients; }),
    int_knob(z + "reduce_bucket_size", 1, kBig, [](Config& c) -> auto& { return c.zero.reduce_bucket_size; }),
    int_knob(z + "allgather_bucket_size", 1, kBig, [](Config& c) -> auto& { return c.zero.allgather_bucket_size; }),
    int_knob(z + "stage3_prefetch_bucket_size", 0, kBig, [](Config& c) -> auto& { return c.zero.stage3_prefetch_bucket_size; }),
    int_knob(z + "stage3_max_live_parameters", 0, kBig, [](Config& c) -> auto& { return c.zero.stage3_max_live_parameters; }),
    int_knob(z + "stage3_param_persistence_threshold", 0, kBig, [](Config& c) -> auto& { return c.zero.stage3_param_persistence_threshold; }),
    int_knob(z + "sub_group_size", 1, kBig, [](Config& c) -> auto& { return c.zero.sub_group_size; }),
    int_knob(z + "mics_shard_size", -1, kBig, [](Config& c) -> auto& { return c.zero.mics_shard_size; }),
    fixed(int_knob("tensor_parallel.autotp_size", 1, kBig, [](Config& c) -> auto& { return c.tensor_parallel_size; })),
    fixed(int_knob("pipeline.stages", 1, kBig, [](Config& c) -> auto& { return c.pipeline_parallel_size; })),
    fixed(int_knob("sequence_parallel_size", 1, kBig, [](Config& c) -> auto& { return c.sequence_parallel_size; })),
    bool_knob("expert_parallel.enabled", [](Config& c) -> auto& { return c.autoep.enabled; }),
    fixed(int_knob("expert_parallel.autoep_size", 1, kBig, [](Config& c) -> auto& { return c.autoep.autoep_size; })),
    text_knob("expert_parallel.preset_model", [](Config& c) -> auto& { return c.autoep.preset_model; }),
    bool_knob("expert_parallel.use_grouped_mm", [](Config& c) -> auto& { return c.autoep.use_grouped_mm; }),
    fixed(int_knob("data_parallel_size", 1, kBig, [](Config& c) -> auto& { return c.data_parallel_size; })),
    fixed(int_knob(wq + "num_bits", 0, 8, [](Config& c) -> auto& { return c.weight_quantization.num_bits; })),
    fixed(int_knob(wq + "group_size", 1, kBig, [](Config& c) -> auto& { return c.weight_quantization.group_size; })),
    fixed(int_knob(wq + "group_dim", 0, 1, [](Config& c) -> auto& { return c.weight_quantization.group_dim; })),
    bool_knob(wq + "symmetric", [](Config& c) -> auto& { return c.weight_quantization.symmetric; }),
    int_knob(z + "zero_hpz_partition_size", 1, kBig, [](Config& c) -> auto& { return c.zero.hpz_partition_size; }),
    offload_knob(oo + "device", [](Config& c) -> auto& { return c.zero.offload_optimizer.device; }),
    text_knob(oo + "nvme_path", [](Config& c) -> auto& { return c.zero.offload_optimizer.nvme_path; }),
    bool_knob(oo + "pin_memory", [](Config& c) -> auto& { return c.zero.offload_optimizer.pin_memory; }),
    int_knob(oo + "buffer_count", 1, 1024, [](Config& c) -> auto& { return c.zero.offload_optimizer.buffer_count; }),
    choice_knob(oo + "overlap_step", {"auto", "true", "false"}, [](Config& c) -> auto& { return c.zero.offload_optimizer.overlap_step; }),
    float_knob(oo + "ratio", 0, 1, [](Config& c) -> auto& { return c.zero.offload_optimizer.ratio; }),
    offload_knob(op + "device", [](Config& c) -> auto& { return c.zero.offload_param.device; }),
    text_knob(op + "nvme_path", [](Config& c) -> auto& { return c.zero.offload_param.nvme_path; }),
    bool_knob(op + "pin_memory", [](Config& c) -> auto& { return c.zero.offload_param.pin_memory; }),
    int_knob(op + "buffer_count", 1, 1024, [](Config& c) -> auto& { return c.zero.offload_param.buffer_count; }),
    int_knob(op + "max_in_cpu", 0, kBig, [](Config& c) -> auto& { return c.zero.offload_param.max_in_cpu; }),
    int_knob("aio.block_size", 4096, 1 << 30, [](Config& c) -> auto& { return c.aio.block_size; }, 4096),
    int_knob("aio.queue_depth", 1, 4096, [](Config& c) -> auto& { return c.aio.queue_depth; }),
    int_knob("aio.intra_op_parallelism", 1, 256, [](Config& c) -> auto& { return c.aio.intra_op_parallelism; }),
    bool_knob("aio.single_submit", [](Config& c) -> auto& { return c.aio.single_submit; }),
    bool_knob("aio.overlap_events", [](Config& c) -> auto& { return c.aio.overlap_events; }),
  };
  // clang-format on
}

std::string number_text(double v) {
  if (v >= kBig) return "inf";
  return fmt::format("{}", v);
}

}  // namespace

std::string Knob::allowed() const {
  const std::string auto_text = auto_ok ? " or auto" : "";
  switch (type) {
    case Type::Bool:
      return "true or false";
    case Type::Int: {
      std::string text = fmt::format("integer {}..{}", number_text(min), number_text(max));
      if (multiple_of > 1) text += fmt::format(", a multiple of {}", multiple_of);
      return text + auto_text;
    }
    case Type::Float:
      return fmt::format("number {}{}..{}{}", min_exclusive ? ">" : "", number_text(min),
                         number_text(max), auto_text);
    case Type::FloatList:
      return fmt::format("a number {}..{}, or a list of them (one per parameter group){}",
                         number_text(min), number_text(max), auto_text);
    case Type::Betas:
      return "a list of two numbers in [0, 1), e.g. [0.9, 0.999], or auto";
    case Type::Choice:
      return fmt::format("one of {}", fmt::join(choices, ", "));
    case Type::Text:
      return "a string";
    case Type::Offload:
      return "one of none, cpu, nvme or auto";
  }
  return "";
}

const std::vector<Knob>& config_knobs() {
  static const auto* knobs = new std::vector<Knob>(build_knobs());
  return *knobs;
}

const Knob* find_knob(const std::string& path) {
  for (const auto& knob : config_knobs()) {
    if (knob.path == path) return &knob;
  }
  return nullptr;
}

bool is_config_section(const std::string& path) {
  if (path.empty()) return true;
  auto under = [&](const std::string& key) {
    return key.compare(0, path.size() + 1, path + ".") == 0;
  };
  return std::any_of(config_knobs().begin(), config_knobs().end(),
                     [&](const Knob& k) { return under(k.path); }) ||
         std::any_of(ignored_keys().begin(), ignored_keys().end(),
                     [&](const auto& e) { return under(e.first); }) ||
         std::any_of(python_keys().begin(), python_keys().end(),
                     [&](const auto& e) { return under(e.first); }) ||
         std::any_of(lacked_features().begin(), lacked_features().end(),
                     [&](const auto& e) { return under(e.first); });
}

std::vector<std::string> section_children(const std::string& section) {
  std::vector<std::string> children;
  auto add = [&](const std::string& path) {
    if (section.empty() ? true : path.compare(0, section.size() + 1, section + ".") == 0) {
      const std::string rest = section.empty() ? path : path.substr(section.size() + 1);
      const std::string child = rest.substr(0, rest.find('.'));
      if (std::find(children.begin(), children.end(), child) == children.end())
        children.push_back(child);
    }
  };
  for (const auto& knob : config_knobs()) add(knob.path);
  for (const auto& entry : ignored_keys()) add(entry.first);
  for (const auto& entry : python_keys()) add(entry.first);
  for (const auto& entry : lacked_features()) add(entry.first);
  return children;
}

}  // namespace zeroshard
