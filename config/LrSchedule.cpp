#include "config/LrSchedule.h"

#include <algorithm>
#include <cmath>

namespace zeroshard {

double learning_rate(const Config& c, int64_t step) {
  const auto& s = c.scheduler;
  if (s.type == "none") return *c.optimizer.lr;
  const double min_lr = *s.warmup_min_lr;
  const double max_lr = *s.warmup_max_lr;
  const auto warmup = static_cast<double>(*s.warmup_num_steps);
  const auto t = static_cast<double>(step);
  if (t < warmup) {
    const double gamma =
        s.warmup_type == "log" ? std::log(t + 1) / std::log(std::max(2.0, warmup)) : t / warmup;
    return min_lr + (max_lr - min_lr) * gamma;
  }
  if (s.type == "WarmupLR") return max_lr;
  const auto total = static_cast<double>(*s.total_num_steps);
  const double progress = std::clamp((t - warmup) / std::max(1.0, total - warmup), 0.0, 1.0);
  if (s.type == "WarmupDecayLR") return max_lr * (1 - progress);
  return min_lr + (max_lr - min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
}

}  // namespace zeroshard
