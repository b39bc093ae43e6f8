#include "plan/DeepSpeedEstimate.h"

#include <algorithm>

namespace zeroshard {
namespace {

constexpr double kBufferFactor = 1.5;  // DeepSpeed's additional_buffer_factor

DeepSpeedEstimate zero2(bool cpu_offload, double p, const WorldShape& w) {
  const double gpus = static_cast<double>(w.ranks());
  if (cpu_offload) {
    return {static_cast<int64_t>(2 * p),
            static_cast<int64_t>(p * std::max(4 * gpus, 16.0) * kBufferFactor)};
  }
  return {static_cast<int64_t>(4 * p + static_cast<int64_t>(16 * p / gpus)),
          static_cast<int64_t>(p * 4 * w.ranks_per_node * kBufferFactor)};
}

// zero_init=True, DeepSpeed's default.
DeepSpeedEstimate zero3(bool cpu_offload, bool offload_params, double p, double largest,
                        const WorldShape& w) {
  const double gpus = static_cast<double>(w.ranks());
  const double node_factor = 1.0 / static_cast<double>(w.nodes);
  const double largest_memory = 4 * largest;
  if (cpu_offload && offload_params) {
    return {static_cast<int64_t>(largest_memory),
            static_cast<int64_t>(p * 18 * node_factor * kBufferFactor)};
  }
  if (cpu_offload) {
    return {static_cast<int64_t>(largest_memory + static_cast<int64_t>(2 * p / gpus)),
            static_cast<int64_t>(p * 16 * node_factor * kBufferFactor)};
  }
  return {static_cast<int64_t>(largest_memory + static_cast<int64_t>(18 * p / gpus)),
          static_cast<int64_t>(largest * 4 * w.ranks_per_node * kBufferFactor)};
}

}  // namespace

std::optional<DeepSpeedEstimate> deepspeed_estimate(const PlanOption& o, int64_t total_params,
                                                    int64_t largest_layer_params,
                                                    const WorldShape& world) {
  const auto p = static_cast<double>(total_params);
  const bool opt_cpu = o.optimizer == OffloadDevice::Cpu;
  const bool opt_none = o.optimizer == OffloadDevice::None;
  if (o.stage == 2 && (opt_cpu || opt_none)) return zero2(opt_cpu, p, world);
  if (o.stage != 3 || !(opt_cpu || opt_none)) return std::nullopt;
  if (o.params == OffloadDevice::Cpu && opt_cpu) {
    return zero3(true, true, p, static_cast<double>(largest_layer_params), world);
  }
  if (o.params == OffloadDevice::None) {
    return zero3(opt_cpu, false, p, static_cast<double>(largest_layer_params), world);
  }
  return std::nullopt;
}

}  // namespace zeroshard
