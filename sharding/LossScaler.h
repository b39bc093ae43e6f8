#pragma once
// fp16 loss scaling as DeepSpeed does it: a static scale, or a dynamic one that is
// halved on overflow (after `hysteresis` overflows in a row) and doubled on the clean
// step that follows each `window` clean steps since the last overflow (DeepSpeed's
// DynamicLossScaler with consecutive_hysteresis off). An overflowing step is skipped.
#include <cstdint>

namespace zeroshard {

struct LossScalerOptions {
  double static_scale = 0;  // > 0: fixed scale, never changed
  int64_t initial_scale_power = 16;
  int64_t window = 1000;
  int64_t hysteresis = 2;
  double min_scale = 1;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options);
  double scale() const { return scale_; }
  // Checkpoints: everything that decides the next scale.
  struct State {
    double scale;
    int64_t hysteresis_left, iteration, last_overflow;
  };
  State state() const { return {scale_, hysteresis_left_, iteration_, last_overflow_}; }
  void restore(const State& s) {
    scale_ = s.scale;
    hysteresis_left_ = s.hysteresis_left;
    iteration_ = s.iteration;
    last_overflow_ = s.last_overflow;
  }
  // Records one step's outcome; returns true when the step must be skipped.
  bool update(bool overflow);

 private:
  LossScalerOptions options_;
  bool grows_now() const;
  double scale_;
  int64_t hysteresis_left_;
  int64_t iteration_ = 0;
  int64_t last_overflow_ = -1;
};

}  // namespace zeroshard
