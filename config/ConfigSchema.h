#pragma once
// The table of every config knob: its key path, type, allowed values and where it
// lives in Config. Loading, validation, did-you-mean and emission all read it, so
// a knob is declared once.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/Config.h"

namespace zeroshard {

struct Knob {
  enum class Type { Bool, Int, Float, FloatList, Betas, Choice, Text, Offload };
  std::string path;  // e.g. "zero_optimization.offload_optimizer.device"
  Type type = Type::Int;
  double min = 0;
  double max = 0;
  int64_t multiple_of = 1;  // Int only
  bool min_exclusive = false;
  bool auto_ok = true;
  std::vector<std::string> choices;  // Choice only
  std::function<bool&(Config&)> as_bool;
  std::function<std::optional<int64_t>&(Config&)> as_int;
  std::function<std::optional<double>&(Config&)> as_float;
  // FloatList: a number (every parameter group's) or a list (one per group), each in range.
  std::function<std::optional<std::vector<double>>&(Config&)> as_floats;
  std::function<std::pair<std::optional<double>*, std::optional<double>*>(Config&)> as_betas;
  std::function<std::string&(Config&)> as_text;
  std::function<OffloadDevice&(Config&)> as_offload;

  std::string allowed() const;  // "integer 0..3 or auto", for error messages
};

const std::vector<Knob>& config_knobs();
const Knob* find_knob(const std::string& path);

// Keys DeepSpeed knows that zeroshard accepts and ignores (whole subtrees where the
// key names a section), with the reason shown in the warning; nullptr if not one.
const char* ignored_key_reason(const std::string& path);

// Keys DeepSpeed knows that the Python package reads from the config itself (the C++
// engine has no part in them), with where, shown in the warning; nullptr if not one.
const char* python_key_reason(const std::string& path);

// A DeepSpeed feature zeroshard does not have: accepted while the config leaves it off
// (for a section: no "enabled" key, or enabled false; for a key: the value `off`), refused
// naming it and `instead` (what zeroshard offers) when the config turns it on.
struct LackedFeature {
  const char* off;  // nullptr: a section, off unless its "enabled" is true
  const char* instead;
  bool present_is_on = false;  // a section DeepSpeed turns on by being there at all
};
const LackedFeature* lacked_feature(const std::string& path);

// The tables whole (config/DeepSpeedKeys.cpp), by path.
const std::map<std::string, const char*>& ignored_keys();
const std::map<std::string, const char*>& python_keys();
const std::map<std::string, LackedFeature>& lacked_features();

// DeepSpeed's older name of a key ("aio.thread_count"), read as the newer one; the path
// itself where it is not one.
std::string current_key_name(const std::string& path);

// Section paths ("", "zero_optimization", ...) and the child names each may hold.
bool is_config_section(const std::string& path);
std::vector<std::string> section_children(const std::string& section);

}  // namespace zeroshard
