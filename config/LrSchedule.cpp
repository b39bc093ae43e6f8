#include "config/LrSchedule.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

const std::vector<std::string> kWarmup{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                       "warmup_type", "last_batch_iteration"};

bool left_out(const SchedulerConfig& s, const std::string& key) {
  if (key == "last_batch_iteration") return true;  // -1 only: nothing to write
  if (key == "total_num_steps") return s.total_num_steps && *s.total_num_steps == 0;
  if (key == "cycle_second_step_size") return s.cycle_second_step_size == int64_t{-1};
  if (key == "cycle_second_stair_count") return s.cycle_second_stair_count == int64_t{-1};
  const std::map<std::string, const std::optional<std::vector<double>>*> lists{
      {"warmup_min_lr", &s.warmup_min_lr},
      {"warmup_max_lr", &s.warmup_max_lr},
      {"cycle_min_lr", &s.cycle_min_lr},
      {"cycle_max_lr", &s.cycle_max_lr},
      {"cycle_min_mom", &s.cycle_min_mom},
      {"cycle_max_mom", &s.cycle_max_mom},
      {"lr_range_test_min_lr", &s.lr_range_test_min_lr}};
  const auto it = lists.find(key);
  return it != lists.end() && *it->second && (*it->second)->empty();
}

}  // namespace

const std::vector<std::string>& scheduler_keys(const std::string& type) {
  static const auto* keys = new std::map<std::string, std::vector<std::string>>{
      {"none", {}},
      {"WarmupLR", kWarmup},
      {"WarmupDecayLR",
       {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
        "last_batch_iteration"}},
      {"WarmupCosineLR",
       {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
        "last_batch_iteration"}},
      {"OneCycle",
       {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
        "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
        "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
        "last_batch_iteration"}},
      {"LRRangeTest",
       {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
        "lr_range_test_staircase", "last_batch_iteration"}},
  };
  static const std::vector<std::string> none;
  const auto it = keys->find(type);
  return it == keys->end() ? none : it->second;
}

bool scheduler_key_written(const SchedulerConfig& s, const std::string& key) {
  const auto& keys = scheduler_keys(s.type);
  return std::find(keys.begin(), keys.end(), key) != keys.end() && !left_out(s, key);
}

void check_scheduler(const SchedulerConfig& s) {
  const auto& keys = scheduler_keys(s.type);
  for (const auto& key : s.given) {
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    if (s.type == "none") {
      fail(
          "config key 'scheduler.params.{}' is set but no scheduler.type is; allowed: a "
          "scheduler.type (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) "
          "or no params",
          key);
    }
    fail("config key 'scheduler.params.{}' is not a parameter of DeepSpeed's {}; allowed: {}", key,
         s.type, fmt::join(keys, ", "));
  }
  if ((s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR") && left_out(s, "total_num_steps"))
    fail(
        "config key 'scheduler.params.total_num_steps' is missing; {} requires it (DeepSpeed's "
        "has no default); allowed: an integer >= 1, or auto",
        s.type);
  if (s.type == "OneCycle") {
    for (const char* key : {"cycle_min_lr", "cycle_max_lr"})
      if (left_out(s, key))
        fail(
            "config key 'scheduler.params.{}' is missing; OneCycle requires it (DeepSpeed's "
            "has no default); allowed: a number, or a list of one per parameter group",
            key);
  }
}

LrSchedule::LrSchedule(const SchedulerConfig& resolved, std::vector<double> group_lrs,
                       bool has_betas)
    : type_(resolved.type), s_(resolved), group_lrs_(std::move(group_lrs)) {
  if (!active()) return;
  check_scheduler(s_);
  warmup_steps_ = std::max<int64_t>(2, s_.warmup_num_steps.value_or(1000));
  if (type_ == "WarmupLR" || type_ == "WarmupDecayLR") {
    min_lrs_ = per_group(s_.warmup_min_lr, "warmup_min_lr", {0.0});
    max_lrs_ = per_group(s_.warmup_max_lr, "warmup_max_lr",
                         type_ == "WarmupLR" ? group_lrs_ : std::vector<double>{0.001});
  } else if (type_ == "OneCycle") {
    min_lrs_ = per_group(s_.cycle_min_lr, "cycle_min_lr", {});
    max_lrs_ = per_group(s_.cycle_max_lr, "cycle_max_lr", {});
    cycles_momentum_ = s_.cycle_momentum && has_betas;
    min_moms_ = per_group(s_.cycle_min_mom, "cycle_min_mom", {0.8});
    max_moms_ = per_group(s_.cycle_max_mom, "cycle_max_mom", {0.9});
  } else if (type_ == "LRRangeTest") {
    min_lrs_ = per_group(s_.lr_range_test_min_lr, "lr_range_test_min_lr", {1e-3});
  }
}

// One value for every group, or one per group (DeepSpeed's _format_param).
std::vector<double> LrSchedule::per_group(const std::optional<std::vector<double>>& values,
                                          const std::string& key,
                                          std::vector<double> left_out) const {
  std::vector<double> v = values && !values->empty() ? *values : std::move(left_out);
  const size_t groups = group_lrs_.size();
  if (v.size() == 1) return std::vector<double>(groups, v.front());
  if (v.size() != groups) {
    fail(
        "config key 'scheduler.params.{}' has {} values but the optimizer has {} parameter "
        "groups; allowed: one number, or one per group",
        key, v.size(), groups);
  }
  return v;
}

// During warmup (0 <= it < warmup_steps_): 0 -> 1, DeepSpeed's operations in its order.
double LrSchedule::warmup_fraction(int64_t it) const {
  if (s_.warmup_type == "linear")
    return static_cast<double>(it) / static_cast<double>(warmup_steps_);
  const double inverse_log = 1.0 / std::log(static_cast<double>(warmup_steps_));
  return inverse_log * std::log(static_cast<double>(it + 1));
}

std::vector<ScheduledGroup> LrSchedule::at(int64_t advanced) const {
  std::vector<ScheduledGroup> out(group_lrs_.size());
  if (!active()) {
    for (size_t g = 0; g < out.size(); ++g) out[g].lr = group_lrs_[g];
    return out;
  }
  const int64_t it = advanced - 1;  // DeepSpeed's last_batch_iteration
  if (type_ == "WarmupLR" || type_ == "WarmupDecayLR") {
    warmup(it, out);
  } else if (type_ == "WarmupCosineLR") {
    cosine(it, out);
  } else if (type_ == "OneCycle") {
    one_cycle(it, out);
  } else {  // LRRangeTest
    const double size = static_cast<double>(*s_.lr_range_test_step_size);
    const double steps = static_cast<double>(it + 1);
    const double interval = s_.lr_range_test_staircase ? std::floor(steps / size) : steps / size;
    const double increase = 1 + *s_.lr_range_test_step_rate * interval;
    for (size_t g = 0; g < out.size(); ++g) out[g].lr = min_lrs_[g] * increase;
  }
  return out;
}

void LrSchedule::warmup(int64_t it, std::vector<ScheduledGroup>& out) const {
  double gamma = 1.0;
  if (it < 0) {
    gamma = 0.0;  // before the first advance: warmup_min_lr
  } else if (it < warmup_steps_) {
    gamma = warmup_fraction(it);
  } else if (type_ == "WarmupDecayLR") {
    const double total = static_cast<double>(*s_.total_num_steps);
    gamma = std::max(0.0, (total - static_cast<double>(it)) /
                              std::max(1.0, total - static_cast<double>(warmup_steps_)));
  }
  for (size_t g = 0; g < out.size(); ++g)
    out[g].lr = it < 0 ? min_lrs_[g] : min_lrs_[g] + (max_lrs_[g] - min_lrs_[g]) * gamma;
}

void LrSchedule::cosine(int64_t it, std::vector<ScheduledGroup>& out) const {
  double ratio = 0.0;  // before the first advance
  if (it >= 0 && it < warmup_steps_) {
    const double min_ratio = *s_.warmup_min_ratio;
    ratio = min_ratio + warmup_fraction(it) * (1. - min_ratio);
  } else if (it >= 0) {
    const double done = static_cast<double>(it - warmup_steps_ + 1);
    const double total =
        static_cast<double>(std::max<int64_t>(1, *s_.total_num_steps - warmup_steps_));
    const double progress = std::min(1.0, done / total);
    const double cos_min = *s_.cos_min_ratio;
    ratio = std::max(0.0, cos_min + (1. - cos_min) * ((1 + std::cos(M_PI * progress)) / 2));
  }
  for (size_t g = 0; g < out.size(); ++g) out[g].lr = group_lrs_[g] * ratio;
}

// How far up the cycle iteration `it` is, 0..1 (DeepSpeed's _get_scale_factor).
double LrSchedule::cycle_scale(int64_t it) const {
  const double first = static_cast<double>(*s_.cycle_first_step_size);
  const double second =
      *s_.cycle_second_step_size < 0 ? first : static_cast<double>(*s_.cycle_second_step_size);
  const double total = first + second;
  const double step_ratio = first / total;
  const int64_t first_stairs = *s_.cycle_first_stair_count;
  const int64_t second_stairs =
      *s_.cycle_second_stair_count < 0 ? first_stairs : *s_.cycle_second_stair_count;
  const int64_t batch = it + 1;
  const double cycle = std::floor(1 + static_cast<double>(batch) / total);
  const double x = 1. + static_cast<double>(batch) / total - cycle;
  double scale = 0;
  int64_t stairs = 0;
  if (x <= step_ratio) {
    scale = x / step_ratio;
    stairs = first_stairs;
  } else {
    scale = (x - 1) / (step_ratio - 1);
    stairs = second_stairs;
  }
  if (stairs > 0) {  // from the integer position in the cycle, as DeepSpeed quantises
    const double in_cycle = std::fmod(static_cast<double>(batch), total);
    const double position = in_cycle <= first
                                ? in_cycle * static_cast<double>(stairs) / first
                                : (total - in_cycle) * static_cast<double>(stairs) / second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return scale;
}

void LrSchedule::one_cycle(int64_t it, std::vector<ScheduledGroup>& out) const {
  const double first = static_cast<double>(*s_.cycle_first_step_size);
  const double total =
      first +
      (*s_.cycle_second_step_size < 0 ? first : static_cast<double>(*s_.cycle_second_step_size));
  const bool no_decay_steps = *s_.decay_step_size == 0;
  const bool lr_decays = !no_decay_steps && *s_.decay_lr_rate != 0;
  const bool mom_decays = !no_decay_steps && *s_.decay_mom_rate != 0;
  const bool cycling = static_cast<double>(it) < total;
  const double scale = cycling ? cycle_scale(it) : 0;
  const double decay_interval =
      cycling || no_decay_steps
          ? 0
          : (static_cast<double>(it) - total + 1) / static_cast<double>(*s_.decay_step_size);
  for (size_t g = 0; g < out.size(); ++g) {
    if (cycling) {
      out[g].lr = min_lrs_[g] + (max_lrs_[g] - min_lrs_[g]) * scale;
    } else {
      out[g].lr = lr_decays ? min_lrs_[g] / (1 + *s_.decay_lr_rate * decay_interval) : min_lrs_[g];
    }
    if (!cycles_momentum_) continue;
    out[g].beta2 = 0.99;
    if (it < 0) {
      out[g].beta1 = min_moms_[g];  // DeepSpeed sets the lower bound when it builds the scheduler
    } else if (cycling) {
      out[g].beta1 = max_moms_[g] - (max_moms_[g] - min_moms_[g]) * scale;
    } else {
      out[g].beta1 =
          mom_decays ? max_moms_[g] * (1 + *s_.decay_mom_rate * decay_interval) : max_moms_[g];
    }
  }
}

}  // namespace zeroshard
