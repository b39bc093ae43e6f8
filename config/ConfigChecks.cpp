// The checks across keys (config/Config.h): contradictions a loaded config is refused
// for, each naming the keys, their values and what is allowed, and what rules out the
// overlapped step.
#include <fmt/format.h>

#include "common/Error.h"
#include "config/Config.h"
#include "config/LrSchedule.h"

namespace zeroshard {
namespace {

bool offloads(OffloadDevice d) {
  return d == OffloadDevice::Cpu || d == OffloadDevice::Nvme;
}

void check_mics(const Config& c) {
  const auto& mics = c.zero.mics_shard_size;
  if (!mics || *mics == -1) return;
  if (*mics == 0) {
    fail(
        "config key 'zero_optimization.mics_shard_size' is 0; allowed: -1 (shard across every "
        "rank), auto, or a group size >= 1 that divides the number of ranks");
  }
  if (c.zero.stage && *c.zero.stage == 0) {
    fail(
        "config key 'zero_optimization.mics_shard_size' is {} with 'zero_optimization.stage' 0; "
        "allowed: sharding groups need stage 1, 2 or 3 (or mics_shard_size -1)",
        *mics);
  }
}

// hpZ keeps a secondary copy of stage 3's parameters; the checks that need the world
// size (the group must divide it) are the Planner's.
void check_hpz(const Config& c) {
  const auto& hpz = c.zero.hpz_partition_size;
  if (!hpz || *hpz == 1) return;
  const char* key = "config key 'zero_optimization.zero_hpz_partition_size'";
  if (c.zero.stage && *c.zero.stage != 3) {
    fail(
        "{} is {} with 'zero_optimization.stage' {}; allowed: the secondary copy (ZeRO++ hpZ) "
        "is of stage 3's parameters: stage 3, or zero_hpz_partition_size 1",
        key, *hpz, *c.zero.stage);
  }
  const auto& mics = c.zero.mics_shard_size;
  if (mics && *mics > 0) {
    fail(
        "{} is {} with 'zero_optimization.mics_shard_size' {}; allowed: one of the two: "
        "mics_shard_size keeps every gather inside its group already (set "
        "zero_hpz_partition_size 1, or mics_shard_size -1)",
        key, *hpz, *mics);
  }
  if (offloads(c.zero.offload_param.device)) {
    fail(
        "{} is {} with 'zero_optimization.offload_param.device' '{}'; allowed: "
        "zero_hpz_partition_size 1 with parameter offload (the secondary copy would hold "
        "the parameters in device memory that offload frees)",
        key, *hpz, offload_device_name(c.zero.offload_param.device));
  }
}

// offload_optimizer.ratio below 1: part of the optimizer stays on the GPU. As DeepSpeed,
// only at stage 3 with CPU Adam; its resident part steps where the parameters are, so
// they stay there too.
void check_offload_ratio(const Config& c) {
  const auto& ratio = c.zero.offload_optimizer.ratio;
  if (!ratio || *ratio >= 1) return;
  const std::string key =
      fmt::format("config key 'zero_optimization.offload_optimizer.ratio' is {}", *ratio);
  const OffloadDevice device = c.zero.offload_optimizer.device;
  if (device != OffloadDevice::Cpu) {
    fail(
        "{} with 'zero_optimization.offload_optimizer.device' '{}'; allowed: device cpu (the "
        "shards not offloaded step on the GPU), or ratio 1",
        key, offload_device_name(device));
  }
  if (c.zero.stage && *c.zero.stage != 3) {
    fail("{} with 'zero_optimization.stage' {}; allowed: stage 3 (as DeepSpeed), or ratio 1", key,
         *c.zero.stage);
  }
  if (c.optimizer.external || c.optimizer.type == "Lamb") {
    fail("{} with optimizer {}; allowed: optimizer Adam or AdamW, or ratio 1", key,
         c.optimizer.type);
  }
  const OffloadDevice params = c.zero.offload_param.device;
  if (offloads(params)) {
    fail(
        "{} with 'zero_optimization.offload_param.device' '{}'; allowed: offload_param.device "
        "none (the shards not offloaded step where their parameters are, on the GPU), or ratio 1",
        key, offload_device_name(params));
  }
}

// overlap_step: true asks for the step inside backward; refused where that would not be
// exact or could not run (auto resolves to false there instead, and the Planner says why).
void check_overlap_step(const Config& c) {
  if (c.zero.offload_optimizer.overlap_step != "true") return;
  if (const auto o = overlap_step_obstacle(c)) {
    fail(
        "config key 'zero_optimization.offload_optimizer.overlap_step' is true with {}; "
        "allowed: {}, or overlap_step false or auto ({})",
        o->setting, o->allowed, o->why);
  }
}

}  // namespace

std::optional<OverlapStepObstacle> overlap_step_obstacle(const Config& c) {
  const auto& z = c.zero;
  if (c.optimizer.type == "Lamb") {
    return OverlapStepObstacle{
        "'optimizer.type' Lamb", "optimizer.type Adam or AdamW",
        "Lamb's trust ratio needs the norm of every parameter's update before any step"};
  }
  if (c.optimizer.external) {
    return OverlapStepObstacle{
        fmt::format("'optimizer.type' {}", c.optimizer.type),
        "optimizer.type Adam or AdamW, whose CPU Adam steps inside backward",
        fmt::format("torch.optim.{} steps after backward", c.optimizer.type)};
  }
  if (z.offload_optimizer.device == OffloadDevice::None) {
    return OverlapStepObstacle{"'zero_optimization.offload_optimizer.device' none",
                               "overlap_step steps an offloaded optimizer (device cpu or nvme)",
                               "the optimizer is not offloaded (offload_optimizer.device none)"};
  }
  if (z.stage && *z.stage < 2) {
    return OverlapStepObstacle{
        fmt::format("'zero_optimization.stage' {}", *z.stage),
        "stage 2 or 3, whose backward reduces each gradient shard",
        fmt::format("stage {} reduces the gradients after backward", *z.stage)};
  }
  const double clipping = c.gradient_clipping.value_or(0);
  if (clipping > 0) {
    return OverlapStepObstacle{
        fmt::format("'gradient_clipping' {}", clipping), "gradient_clipping 0",
        fmt::format("gradient_clipping {} needs the norm of every gradient before any step",
                    clipping)};
  }
  if (c.fp16.enabled) {
    return OverlapStepObstacle{
        "'fp16.enabled' true", "bf16 or fp32",
        "fp16 loss scaling skips a step only known to overflow after backward"};
  }
  if (z.offload_optimizer.ratio && *z.offload_optimizer.ratio < 1) {
    return OverlapStepObstacle{
        fmt::format("'zero_optimization.offload_optimizer.ratio' {}", *z.offload_optimizer.ratio),
        "ratio 1", "the shards kept on the GPU step after backward"};
  }
  if (z.offload_param.device == OffloadDevice::Nvme) {
    return OverlapStepObstacle{
        "'zero_optimization.offload_param.device' nvme", "parameter offload none or cpu",
        "backward's gathers read the NVMe parameter shards that the step writes"};
  }
  return std::nullopt;
}

void check_weight_quantization(const Config& c) {
  const WeightQuantization& q = c.weight_quantization;
  const std::string key = "weight_quantization.quantized_initialization.";
  const int64_t bits = q.num_bits.value_or(0);
  if (bits != 0 && bits != 4 && bits != 8)
    fail("config key '{}num_bits' is {}; allowed: 4 or 8 (0: not quantized)", key, bits);
  if (!q.enabled()) return;
  if (q.group_dim.value_or(1) != 1) {
    fail(
        "config key '{}group_dim' is {}; allowed: 1 (groups of consecutive elements along each "
        "matrix's rows, as stored)",
        key, *q.group_dim);
  }
  if (!c.zero.stage || *c.zero.stage != 3) {
    fail(
        "config key '{}num_bits' is {} with 'zero_optimization.stage' {}; allowed: stage 3 "
        "(the weights' shards are what is stored quantized)",
        key, bits, c.zero.stage ? std::to_string(*c.zero.stage) : std::string("auto"));
  }
}

namespace {

// activation_checkpointing.offload moves what the engine's blocks save for backward
// (bindings/zeroshard/_activations/offload.py): the policies whose saved tensors pass
// through autograd's saved-tensor hooks compose with it.
void check_activation_offload(const Config& c) {
  const ActivationOffloadConfig& o = c.activation_offload;
  const char* key = "config key 'activation_checkpointing.offload.";
  if (o.device == OffloadDevice::Nvme && o.nvme_path.empty()) {
    fail(
        "{}nvme_path' is missing; allowed: a directory on a local file system, required with "
        "device nvme",
        key);
  }
  if (!o.nvme_path.empty() && o.device != OffloadDevice::Nvme) {
    fail("{}nvme_path' is '{}' with device '{}'; allowed: device nvme, or leave nvme_path out", key,
         o.nvme_path, offload_device_name(o.device));
  }
  if (o.device == OffloadDevice::None) return;
  const std::string& mode = c.activation_checkpointing_mode;
  if (c.activation_checkpointing) {
    fail(
        "{}device' is '{}' with 'activation_checkpointing.enabled' true (the model recomputes "
        "its own layers, out of the engine's reach); allowed: mode full instead of enabled "
        "(the engine recomputes the blocks and offloads their inputs)",
        key, offload_device_name(o.device));
  }
  if (mode == "memory_budget" ||
      (mode == "selective" && (c.selective_ac_option.empty() || c.selective_ac_option == "op"))) {
    fail(
        "{}device' is '{}' with mode '{}'{}: not composed in zeroshard yet ({}); allowed: mode "
        "none (every saved activation offloaded), full (the blocks' inputs offloaded), auto or "
        "selective with an integer selective_ac_option",
        key, offload_device_name(o.device), mode, mode == "selective" ? " and option op" : "",
        mode == "selective" ? "the kept op outputs stay in torch's selective-checkpoint cache"
                            : "the budget counts device bytes before offload");
  }
}

// activation_checkpointing.mode and its two companions (config/Config.h).
void check_activation_policy(const Config& c) {
  const std::string& mode = c.activation_checkpointing_mode;
  const std::string& option = c.selective_ac_option;
  const char* key = "config key 'activation_checkpointing.";
  if (!option.empty()) {
    const bool every = option.find_first_not_of("0123456789") == std::string::npos &&
                       option.size() < 10 && std::stoll(option) >= 1;
    if (option != "op" && !every) {
      fail(
          "{}selective_ac_option' is '{}'; allowed: op (every block keeps its matmul outputs "
          "and recomputes the rest) or a positive integer N (every Nth block recomputed whole)",
          key, option);
    }
    if (mode != "selective") {
      fail(
          "{}selective_ac_option' is '{}' with mode '{}'; allowed: mode selective, or leave "
          "selective_ac_option out",
          key, option, mode);
    }
  }
  if (c.activation_memory_budget && mode != "memory_budget") {
    fail(
        "{}memory_budget' is {} with mode '{}'; allowed: mode memory_budget, or leave "
        "memory_budget out",
        key, *c.activation_memory_budget, mode);
  }
  if (c.activation_checkpointing && mode != "none") {
    fail(
        "config keys 'activation_checkpointing.enabled' true and 'activation_checkpointing.mode' "
        "'{}': enabled tells the planner the model recomputes its own blocks, mode makes the "
        "engine recompute them; allowed: one of the two",
        mode);
  }
  check_activation_offload(c);
}

}  // namespace

void check_contradictions(const Config& c) {
  check_weight_quantization(c);
  check_activation_policy(c);
  if (c.bf16 && c.fp16.enabled) {
    fail("config keys 'bf16.enabled' and 'fp16.enabled' are both true; allowed: at most one");
  }
  const bool lamb = c.optimizer.type == "Lamb";
  if (!c.optimizer.bias_correction && c.optimizer.external) {
    fail(
        "config key 'optimizer.params.bias_correction' is false with torch.optim.{}; allowed: "
        "false with zeroshard's Adam, AdamW or Lamb (DeepSpeed's), or true",
        c.optimizer.type);
  }
  const bool lamb_keys =
      c.optimizer.max_coeff || c.optimizer.min_coeff || c.optimizer.eps_inside_sqrt;
  if (lamb_keys && !lamb) {
    fail(
        "config keys 'optimizer.params.max_coeff', 'min_coeff' and 'eps_inside_sqrt' are "
        "Lamb's, but 'optimizer.type' is {}; allowed: optimizer.type Lamb",
        c.optimizer.type);
  }
  if (c.optimizer.max_grad_norm.value_or(0) > 0) {
    fail(
        "config key 'optimizer.params.max_grad_norm' is {}; allowed: 0 (clip with the "
        "top-level 'gradient_clipping', which clips the global norm before any optimizer)",
        *c.optimizer.max_grad_norm);
  }
  if (lamb && c.optimizer.max_coeff.value_or(10) < c.optimizer.min_coeff.value_or(0.01)) {
    fail(
        "config key 'optimizer.params.max_coeff' is {} below 'min_coeff' {}; allowed: "
        "max_coeff >= min_coeff",
        c.optimizer.max_coeff.value_or(10), c.optimizer.min_coeff.value_or(0.01));
  }
  if (lamb && c.zero.offload_optimizer.device == OffloadDevice::Nvme) {
    fail(
        "config key 'zero_optimization.offload_optimizer.device' is 'nvme' with 'optimizer.type' "
        "Lamb; allowed: cpu or none (Lamb's state stays in memory)");
  }
  const auto& oo = c.zero.offload_optimizer;
  const auto& op = c.zero.offload_param;
  if (c.zero.stage && offloads(op.device) && *c.zero.stage < 3) {
    fail(
        "config key 'zero_optimization.offload_param.device' is '{}' with "
        "'zero_optimization.stage' {}; allowed: parameter offload needs stage 3 (or stage auto)",
        offload_device_name(op.device), *c.zero.stage);
  }
  if (c.zero.stage && offloads(oo.device) && *c.zero.stage < 1) {
    fail(
        "config key 'zero_optimization.offload_optimizer.device' is '{}' with "
        "'zero_optimization.stage' 0; allowed: optimizer offload needs stage 1, 2 or 3",
        offload_device_name(oo.device));
  }
  if (oo.device == OffloadDevice::Nvme && c.optimizer.external && !c.optimizer.elementwise) {
    fail(
        "config key 'zero_optimization.offload_optimizer.device' is 'nvme' with optimizer {}, "
        "whose update needs every group's whole parameters in one step; allowed: cpu or none, "
        "or an elementwise optimizer (Adam, AdamW, SGD, Adagrad, ...), whose state zeroshard "
        "streams through NVMe",
        c.optimizer.type);
  }
  if (oo.device == OffloadDevice::Nvme && oo.nvme_path.empty()) {
    fail(
        "config key 'zero_optimization.offload_optimizer.nvme_path' is missing; "
        "allowed: a directory on a local file system, required with device nvme");
  }
  if (op.device == OffloadDevice::Nvme && op.nvme_path.empty()) {
    fail(
        "config key 'zero_optimization.offload_param.nvme_path' is missing; "
        "allowed: a directory on a local file system, required with device nvme");
  }
  check_mics(c);
  check_hpz(c);
  check_offload_ratio(c);
  check_overlap_step(c);
  // DeepSpeed only warns where warmup_num_steps exceeds total_num_steps; so does the planner.
  check_scheduler(c.scheduler);
}

}  // namespace zeroshard
