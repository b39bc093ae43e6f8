// emit_config_yaml: writes every knob of a Config, in schema order, as YAML that
// load_config_string reads back to the same Config.
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "config/Config.h"
#include "config/ConfigSchema.h"
#include "config/LrSchedule.h"

namespace zeroshard {
namespace {

std::string number(double v) {
  return fmt::format("{}", v);
}

template <typename T>
std::string optional_text(const std::optional<T>& v) {
  if (!v) return "auto";
  return fmt::format("{}", *v);
}

YAML::Node knob_value(const Knob& knob, Config& config) {
  switch (knob.type) {
    case Knob::Type::Bool:
      return YAML::Node(knob.as_bool(config));
    case Knob::Type::Int:
      return YAML::Node(optional_text(knob.as_int(config)));
    case Knob::Type::Float:
      return YAML::Node(optional_text(knob.as_float(config)));
    case Knob::Type::FloatList: {
      const auto& values = knob.as_floats(config);
      if (!values) return YAML::Node("auto");
      if (values->size() == 1) return YAML::Node(number(values->front()));
      YAML::Node list(YAML::NodeType::Sequence);
      for (double v : *values) list.push_back(number(v));
      list.SetStyle(YAML::EmitterStyle::Flow);
      return list;
    }
    case Knob::Type::Betas: {
      auto [b1, b2] = knob.as_betas(config);
      if (!*b1 || !*b2) return YAML::Node("auto");
      YAML::Node list(YAML::NodeType::Sequence);
      list.push_back(number(**b1));
      list.push_back(number(**b2));
      list.SetStyle(YAML::EmitterStyle::Flow);
      return list;
    }
    case Knob::Type::Choice:
    case Knob::Type::Text:
      return YAML::Node(knob.as_text(config));
    case Knob::Type::Offload:
      return YAML::Node(offload_device_name(knob.as_offload(config)));
  }
  return {};
}

// Sets root[a][b][c] = value for path "a.b.c"; yaml-cpp keeps insertion order.
void set_path(YAML::Node root, const std::string& path, const YAML::Node& value) {
  std::stringstream parts(path);
  std::string part;
  std::vector<std::string> keys;
  while (std::getline(parts, part, '.')) keys.push_back(part);
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < keys.size(); ++i) node.reset(node[keys[i]]);
  node[keys.back()] = value;
}

bool is_lamb_param(const std::string& path) {
  return path == "optimizer.params.max_coeff" || path == "optimizer.params.min_coeff" ||
         path == "optimizer.params.max_grad_norm" || path == "optimizer.params.eps_inside_sqrt";
}

}  // namespace

std::string emit_config_yaml(const Config& config) {
  Config copy = config;  // accessors hand out references into a mutable Config
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& knob : config_knobs()) {
    // Unset train_batch_size means micro x accumulation x ranks; writing it would fix it.
    if (knob.path == "train_batch_size" && !config.train_batch_size) continue;
    // Unset data_parallel_size checks nothing; writing it would fix it to this world.
    if (knob.path == "data_parallel_size" && !config.data_parallel_size) continue;
    if ((knob.type == Knob::Type::Text || knob.type == Knob::Type::Choice) &&
        knob.as_text(copy).empty()) {
      continue;  // unset
    }
    // A number with no auto that was left out stays out (written back, "auto" would be
    // refused).
    if (knob.type == Knob::Type::Float && !knob.auto_ok && !knob.as_float(copy)) continue;
    // A torch.optim class's params are its own keyword arguments, not Adam's knobs.
    if (config.optimizer.external && knob.path.rfind("optimizer.params.", 0) == 0) continue;
    // Lamb's own params: only with Lamb, and only where set (unset: DeepSpeed's defaults).
    if (is_lamb_param(knob.path) && (config.optimizer.type != "Lamb" ||
                                     (knob.type == Knob::Type::Float && !knob.as_float(copy)))) {
      continue;
    }
    // A scheduler's own keys only, and only those set (config/LrSchedule.h): another
    // scheduler's key, or a left-out one written back, would be read as given.
    if (knob.path.rfind("scheduler.params.", 0) == 0 &&
        !scheduler_key_written(config.scheduler, knob.path.substr(17)))
      continue;
    set_path(root, knob.path, knob_value(knob, copy));
  }
  if (config.optimizer.external) {
    YAML::Node params(YAML::NodeType::Map);
    for (const auto& [key, text] : config.optimizer.torch_params) params[key] = YAML::Load(text);
    root["optimizer"]["params"] = params;
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace zeroshard
