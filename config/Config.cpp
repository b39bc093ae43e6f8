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
    case Knob::Type::FloatList: {
      auto& values = knob.as_floats(config);
      if (is_auto(node) && knob.auto_ok) {
        values = std::nullopt;
        return;
      }
      std::vector<double> parsed;
      double v = 0;
      if (node.IsSequence() && node.size() > 0) {
        for (const auto& item : node) {
          if (!parse_number(item, v) || !in_range(knob, v)) bad_value(knob, node, origin);
          parsed.push_back(v);
        }
      } else if (parse_number(node, v) && in_range(knob, v)) {
        parsed.push_back(v);
      } else {
        bad_value(knob, node, origin);
      }
      values = std::move(parsed);
      return;
    }
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
      out.warnings.push_back(
          fmt::format("config key '{}' is read as '{}' (DeepSpeed's other name for it)",
                      join_path(section, key), path));
    }
    if (const LackedFeature* lacked = lacked_feature(path)) {
      check_left_off(*lacked, path, value, origin);
      out.warnings.push_back(
          fmt::format("config key '{}' is accepted: it leaves off a DeepSpeed feature zeroshard "
                      "does not have",
                      path));
    } else if (const char* where = python_key_reason(path)) {
      out.warnings.push_back(fmt::format("config key '{}' is {}", path, where));
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
      if (path.rfind("scheduler.params.", 0) == 0) out.config.scheduler.given.push_back(key);
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

}  // namespace

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

LoadedConfig load_config_string(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail("{}: not valid YAML or JSON: {}", origin, e.what());
  }
  LoadedConfig out;
  out.origin = origin;
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
