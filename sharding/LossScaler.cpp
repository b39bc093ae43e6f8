#include "sharding/LossScaler.h"

#include <algorithm>
#include <cmath>

#include "common/Logging.h"

namespace zeroshard {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options),
      scale_(options.static_scale > 0 ? options.static_scale
                                      : std::pow(2.0, options.initial_scale_power)),
      hysteresis_left_(options.hysteresis) {}

// DeepSpeed's rule (runtime/fp16/loss_scaler.py): the clean steps between the last
// overflow and this one, a positive multiple of the window.
bool LossScaler::grows_now() const {
  const int64_t stable = iteration_ - last_overflow_ - 1;
  return stable > 0 && stable % options_.window == 0;
}

bool LossScaler::update(bool overflow) {
  const bool dynamic = options_.static_scale <= 0;
  if (overflow) {
    if (dynamic) {
      if (hysteresis_left_ <= 1) {
        const double before = scale_;
        scale_ = std::max(scale_ / 2, options_.min_scale);
        log_info("fp16 overflow: step skipped, loss scale {} -> {}", before, scale_);
      } else {
        --hysteresis_left_;
        log_info("fp16 overflow: step skipped, loss scale kept at {} (hysteresis)", scale_);
      }
    } else {
      log_info("fp16 overflow with static loss scale {}: step skipped", scale_);
    }
    last_overflow_ = iteration_;
  } else if (dynamic && grows_now()) {
    hysteresis_left_ = options_.hysteresis;
    scale_ *= 2;
  }
  ++iteration_;
  return overflow;
}

}  // namespace zeroshard
