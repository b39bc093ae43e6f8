#pragma once
// The config's scheduler, as DeepSpeed 0.19.8 computes it (its runtime/lr_schedules.py),
// compared step by step with DeepSpeed itself (tests/python/test_deepspeed_numbers.py):
//   WarmupLR        warmup_min_lr -> warmup_max_lr over warmup_num_steps (log or linear),
//                   then warmup_max_lr (left out: each parameter group's own lr);
//   WarmupDecayLR   WarmupLR (warmup_max_lr left out: 0.001), then linear to 0 at
//                   total_num_steps;
//   WarmupCosineLR  ratios of each group's lr: warmup_min_ratio -> 1 over warmup_num_steps,
//                   then a cosine to cos_min_ratio at total_num_steps;
//   OneCycle        cycle_min_lr -> cycle_max_lr -> cycle_min_lr (optionally in stairs),
//                   then a decay; with cycle_momentum, beta1 cycles the other way between
//                   cycle_max_mom and cycle_min_mom and beta2 is 0.99 (DeepSpeed's);
//   LRRangeTest     lr_range_test_min_lr x (1 + step_rate x interval).
// Keys that take a list have one value per parameter group, or one for every group.
//
// When it moves: DeepSpeed builds its scheduler before the first step, which sets the
// lr of iteration -1, and advances it after every optimizer step that was applied (not
// after one an fp16 overflow skipped). So the step that follows `advanced` advances uses
// iteration advanced - 1: the first two steps of a warmup both use warmup_min_lr.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/Config.h"

namespace zeroshard {

// The params keys `type` takes (none for "none").
const std::vector<std::string>& scheduler_keys(const std::string& type);

// Whether the emitter writes scheduler.params.`key` of `s`: a key of its type that is not
// left out (an empty list, or the sentinel of a key with no default).
bool scheduler_key_written(const SchedulerConfig& s, const std::string& key);

// Refuses keys of another scheduler and missing required ones, naming them.
void check_scheduler(const SchedulerConfig& s);

struct ScheduledGroup {
  double lr = 0;
  std::optional<double> beta1, beta2;  // set where OneCycle cycles the momentum
};

class LrSchedule {
 public:
  LrSchedule() = default;
  // `resolved`: no auto left. `group_lrs`: each parameter group's own lr (the optimizer's
  // where a group sets none). `has_betas`: whether the optimizer has Adam's betas (without
  // them OneCycle leaves the momentum alone, as DeepSpeed does). Fails naming the key where
  // a list's length is not the number of groups.
  LrSchedule(const SchedulerConfig& resolved, std::vector<double> group_lrs, bool has_betas);

  bool active() const { return type_ != "none"; }
  // Each group's values for the step after `advanced` advances (see above).
  std::vector<ScheduledGroup> at(int64_t advanced) const;

 private:
  std::vector<double> per_group(const std::optional<std::vector<double>>& values,
                                const std::string& key, std::vector<double> left_out) const;
  double warmup_fraction(int64_t it) const;
  void warmup(int64_t it, std::vector<ScheduledGroup>& out) const;
  void cosine(int64_t it, std::vector<ScheduledGroup>& out) const;
  void one_cycle(int64_t it, std::vector<ScheduledGroup>& out) const;
  double cycle_scale(int64_t it) const;

  std::string type_ = "none";
  SchedulerConfig s_;
  std::vector<double> group_lrs_;
  std::vector<double> min_lrs_, max_lrs_, min_moms_, max_moms_;
  int64_t warmup_steps_ = 2;  // DeepSpeed's max(2, warmup_num_steps)
  bool cycles_momentum_ = false;
};

}  // namespace zeroshard
