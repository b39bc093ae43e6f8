#include "config/Config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "common/DidYouMean.h"
#include "common/Error.h"
#include "common/Files.h"
#include "config/ConfigSchema.h"

namespace zeroshard {
namespace {

std::string join_path(const std::string& section, const std::string& key) {
  return section.empty() ? key : section + "." + key;
}

// A scalar's text as the user wrote it, for error messages.
std::string shown(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

bool is_auto(const YAML::Node& node) {
  return node.IsScalar() && node.Scalar() == "auto";
}

[[noreturn]] void bad_value(const Knob& knob, const YAML::Node& node, const std::string& origin) {
  if (is_auto(node)) {  // Hugging Face's configs: its Trainer fills these, the planner cannot
    fail(
        "{}: config key '{}' is 'auto', which the Hugging Face Trainer fills from its "
        "TrainingArguments (zeroshard.integrations.ZeroShardTrainer does too) and the planner "
        "cannot; outside a Trainer give a value; allowed: {}",
        origin, knob.path, knob.allowed());
  }
  fail("{}: config key '{}': value '{}' is not allowed; allowed: {}", origin, knob.path,
       shown(node), knob.allowed());
}

bool parse_number(const YAML::Node& node, double& out) {
  if (!node.IsScalar() || node.Scalar().empty()) return false;
  const std::string& text = node.Scalar();
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  return *end == '\0' && errno == 0 && std::isfinite(out);
}

bool in_range(const Knob& knob, double v) {
  const bool above_min = knob.min_exclusive ? v > knob.min : v >= knob.min;
  return above_min && v <= knob.max;
}

std::optional<double> parse_float(const Knob& knob, const YAML::Node& node,
                                  const std::string& origin) {
  if (is_auto(node) && knob.auto_ok) return std::nullopt;
  double v = 0;
  if (!parse_number(node, v) || !in_range(knob, v)) bad_value(knob, node, origin);
  return v;
}

std::optional<int64_t> parse_int(const Knob& knob, const YAML::Node& node,
                                 const std::string& origin) {
  if (is_auto(node) && knob.auto_ok) return std::nullopt;
  double v = 0;
  // DeepSpeed configs write sizes as 5e8, so integral floats are integers too.
  if (!parse_number(node, v) || v != std::floor(v) || !in_range(knob, v)) {
    bad_value(knob, node, origin);
  }
  const auto value = static_cast<int64_t>(v);
  if (value % knob.multiple_of != 0) bad_value(knob, node, origin);
  return value;
}

bool parse_bool(const Knob& knob, const YAML::Node& node, const std::string& origin) {
  if (node.IsScalar()) {
    const std::string& t = node.Scalar();
    if (t == "true" || t == "True") return true;
    if (t == "false" || t == "False") return false;
  }
  bad_value(knob, node, origin);
}

OffloadDevice parse_offload(const Knob& knob, const YAML::Node& node, const std::string& origin) {
  if (node.IsScalar()) {
    const std::string& t = node.Scalar();
    if (t == "none" || t == "None") return OffloadDevice::None;
    if (t == "cpu") return OffloadDevice::Cpu;
    if (t == "nvme") return OffloadDevice::Nvme;
    if (t == "auto") return OffloadDevice::Auto;
  }
  bad_value(knob, node, origin);
}

void apply_knob(const Knob& knob, const YAML::Node& node, Config& config,
                const std::string& origin) {
  switch (knob.type) {
    case Knob::Type::Bool:
      knob.as_bool(config) = parse_bool(knob, node, origin);
      return;
    case Knob::Type::Int:
      knob.as_int(config) = parse_int(knob, node, origin);
      return;
    case Knob::Type::Float:
      knob.as_float(config) = parse_float(knob, node, origin);
      return;
    case Knob::Type::Betas: {
      auto [beta1, beta2] = knob.as_betas(config);
      if (is_auto(node)) {
        *beta1 = *beta2 = std::nullopt;
        return;
      }
      double b1 = 0, b2 = 0;
      if (!node.IsSequence() || node.size() != 2 || !parse_number(node[0], b1) ||
          !parse_number(node[1], b2) || b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1) {
        bad_value(knob, node, origin);
      }
      *beta1 = b1;
      *beta2 = b2;
      return;
    }
    case Knob::Type::Choice: {
      const std::string text = node.IsScalar() ? node.Scalar() : "";
      if (std::find(knob.choices.begin(), knob.choices.end(), text) == knob.choices.end()) {
        bad_value(knob, node, origin);
      }
      knob.as_text(config) = text;
      return;
    }
    case Knob::Type::Text:
      if (!node.IsScalar()) bad_value(knob, node, origin);
      knob.as_text(config) = node.Scalar();
      return;
    case Knob::Type::Offload:
      knob.as_offload(config) = parse_offload(knob, node, origin);
      return;
  }
}

[[noreturn]] void unknown_key(const std::string& section, const std::string& key,
                              const std::string& origin) {
  const auto children = section_children(section);
  const std::string guess = closest_match(key, children);
  const std::string where = section.empty() ? "at the top level" : "under '" + section + "'";
  if (!guess.empty()) {
    fail("{}: config key '{}' is not known; did you mean '{}'?", origin, join_path(section, key),
         join_path(section, guess));
  }
  fail("{}: config key '{}' is not known; allowed {}: {}", origin, join_path(section, key), where,
       fmt::format("{}", fmt::join(children, ", ")));
}

// A DeepSpeed feature zeroshard lacks may stay in a config only switched off.
void check_left_off(const LackedFeature& lacked, const std::string& path, const YAML::Node& value,
                    const std::string& origin) {
  if (lacked.off == nullptr) {  // a section: off unless enabled
    const YAML::Node enabled = value.IsMap() ? value["enabled"] : YAML::Node();
    const bool off = value.IsMap() && !lacked.present_is_on &&
                     (!enabled || (enabled.IsScalar() && enabled.Scalar() == "false"));
    if (!off) {
      fail(
          "{}: config key '{}' turns on a DeepSpeed feature zeroshard does not have: {}; "
          "allowed: the section left out{}",
          origin, path, lacked.instead, lacked.present_is_on ? "" : ", or with enabled: false");
    }
    return;
  }
  if (!value.IsScalar() || value.Scalar() != lacked.off) {
    fail(
        "{}: config key '{}' is '{}': a DeepSpeed feature zeroshard does not have: {}; "
        "allowed: {}",
        origin, path, shown(value), lacked.instead, lacked.off);
  }
}

void walk(const YAML::Node& map, const std::string& section, LoadedConfig& out,
          const std::string& origin);

// The optimizer section of a torch.optim type (config/TorchOptimizers.h): its params
// are the class's keyword arguments, kept as written for the Python package, which
// passes them to the class (torch then refuses a keyword the class does not take).
// Returns false where the section names zeroshard's own Adam/AdamW (the knobs read it).
bool read_torch_optimizer(const YAML::Node& section, Config& config, const std::string& origin) {
  const YAML::Node type = section["type"];
  if (!type || !type.IsScalar()) return false;
  const std::string name = type.Scalar();
  if (const char* reason = refused_optimizer_reason(name)) {
    fail("{}: config key 'optimizer.type' is '{}': {}; allowed: {}", origin, name, reason,
         find_knob("optimizer.type")->allowed());
  }
  if (!is_torch_optimizer_type(name)) return false;
  OptimizerConfig& o = config.optimizer;
  o.type = name;
  o.external = true;
  for (const auto& entry : section) {
    const std::string key = entry.first.Scalar();
    if (key == "type") continue;
    if (key != "params") unknown_key("optimizer", key, origin);
    if (!entry.second.IsMap()) {
      fail(
          "{}: config key 'optimizer.params' must be a mapping of torch.optim.{}'s keyword "
          "arguments; got '{}'",
          origin, name, shown(entry.second));
    }
    for (const auto& param : entry.second) {
      YAML::Emitter text;
      text << YAML::Flow << param.second;
      o.torch_params[param.first.Scalar()] = text.c_str();
    }
  }
  o.state_bytes = optimizer_state_bytes(name, o.torch_params);
  return true;
}

void walk(const YAML::Node& map, const std::string& section, LoadedConfig& out,
          const std::string& origin) {
  for (const auto& entry : map) {
    if (!entry.first.IsScalar()) {  // YAML allows a mapping or a list as a key ("? ...")
      fail("{}: a config key {} is not a plain name; got '{}'", origin,
           section.empty() ? "at the top level" : "under '" + section + "'", shown(entry.first));
    }
    const std::string key = entry.first.as<std::string>();
    const std::string path = current_key_name(join_path(section, key));
    const YAML::Node& value = entry.second;
    if (path != join_path(section, key)) {
      out.warnings.push_back(fmt::format("config key '{}' is read as '{}' (DeepSpeed's newer name)",
                                         join_path(section, key), path));
    }
    if (const LackedFeature* lacked = lacked_feature(path)) {
      check_left_off(*lacked, path, value, origin);
      out.warnings.push_back(
          fmt::format("config key '{}' is accepted: it leaves off a DeepSpeed feature zeroshard "
                      "does not have",
                      path));
    } else if (const char* reason = ignored_key_reason(path)) {
      out.warnings.push_back(
          fmt::format("config key '{}' is accepted and ignored: {}", path, reason));
    } else if (const Knob* knob = find_knob(path)) {
      if (value.IsNull()) {
        // A choice whose default is unset takes null as DeepSpeed takes None.
        if (knob->type == Knob::Type::Choice && knob->as_text(out.config).empty()) continue;
        fail("{}: config key '{}' has no value; allowed: {}", origin, path, knob->allowed());
      }
      apply_knob(*knob, value, out.config, origin);
    } else if (path == "optimizer" && value.IsMap() &&
               read_torch_optimizer(value, out.config, origin)) {
      continue;
    } else if (is_config_section(path)) {
      if (!value.IsMap()) {
        fail("{}: config key '{}' must be a mapping of keys ({}); got '{}'", origin, path,
             fmt::format("{}", fmt::join(section_children(path), ", ")), shown(value));
      }
      walk(value, path, out, origin);
    } else {
      unknown_key(section, key, origin);
    }
  }
}

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

const char* offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::Auto:
      return "auto";
    case OffloadDevice::None:
      return "none";
    case OffloadDevice::Cpu:
      return "cpu";
    case OffloadDevice::Nvme:
      return "nvme";
  }
  return "?";
}

void check_contradictions(const Config& c) {
  if (c.bf16 && c.fp16.enabled) {
    fail("config keys 'bf16.enabled' and 'fp16.enabled' are both true; allowed: at most one");
  }
  const bool lamb = c.optimizer.type == "Lamb";
  if (!c.optimizer.bias_correction && !lamb) {
    fail(
        "config key 'optimizer.params.bias_correction' is false; allowed: true (zeroshard's "
        "Adam and AdamW correct the moments' bias, as torch's do), or optimizer.type Lamb");
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
  const auto& s = c.scheduler;
  if (s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR") {
    if (s.warmup_num_steps && s.total_num_steps && *s.warmup_num_steps > *s.total_num_steps) {
      fail(
          "config key 'scheduler.params.warmup_num_steps' is {} but 'total_num_steps' is {}; "
          "allowed: warmup_num_steps <= total_num_steps",
          *s.warmup_num_steps, *s.total_num_steps);
    }
  }
}

LoadedConfig load_config_string(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail("{}: not valid YAML or JSON: {}", origin, e.what());
  }
  LoadedConfig out;
  if (root.IsNull()) return out;  // an empty file means every default
  if (!root.IsMap()) fail("{}: a config must be a mapping of keys; got {}", origin, shown(root));
  walk(root, "", out, origin);
  for (const auto& item : root) out.top_level_keys.push_back(item.first.as<std::string>());
  check_contradictions(out.config);
  return out;
}

LoadedConfig load_config_file(const std::string& path) {
  return load_config_string(read_whole_file(path, "config file"), path);
}

}  // namespace zeroshard
