#include "plan/ServingStream.h"

#include <algorithm>

namespace zeroshard {

bool serving_option(const PlanOption& option, const Config& fixed) {
  if (option.stage == 1 || option.stage == 2) return false;
  return option.optimizer == option.params ||
         fixed.zero.offload_optimizer.device != OffloadDevice::Auto;
}

ServingStream serving_stream(const ModelSpec& spec, const PlanOption& option, const Config& config,
                             const WorldShape& world, const TrainingShape& shape,
                             const Bandwidths& bandwidths) {
  const int64_t kl = config.compute_bytes();
  const int64_t d =
      option.stage == 0 ? 1 : sharding_ranks(config, option.stage, world.data_parallel_ranks());
  ServingStream s;
  // Every rank computes with the whole model, gathered or held: its device reads it all,
  // and the whole KV cache; one in host RAM crosses the host link twice a step (each layer's
  // to the device for its turn, and back with the new token's keys and values).
  const int64_t kv = kv_cache_bytes(spec, shape, static_cast<int>(kl));
  s.device_bytes = kl * spec.total_params + kv;
  if (option.kv_cache_on_host) s.host_bytes += 2 * kv;
  if (option.stage == 3 && option.params != OffloadDevice::None) {
    // At rest in their tier's bytes: quantized where weight_quantization says.
    const ParamPlacement placed =
        place_param_shards(spec, option.params, config.zero.offload_param.max_in_cpu.value_or(0), d,
                           kl, config.weight_quantization.layout());
    s.host_bytes += placed.host_bytes;
    s.nvme_bytes = placed.nvme_bytes;
    s.weights = placed.nvme_numel > 0 ? Tier::Nvme : Tier::Host;
  }
  // NVMe reads cross the host link too; a node's drives serve all its ranks.
  s.nvme_rate =
      std::min(bandwidths.nvme / static_cast<double>(world.ranks_per_node), bandwidths.host_link);
  const double device_s = static_cast<double>(s.device_bytes) / bandwidths.device;
  const double host_s = static_cast<double>(s.host_bytes) / bandwidths.host_link;
  const double nvme_s = static_cast<double>(s.nvme_bytes) / s.nvme_rate;
  s.seconds_per_step = device_s + host_s + nvme_s;
  s.bound_by = nvme_s >= std::max(device_s, host_s) && s.nvme_bytes > 0 ? "nvme"
               : host_s >= device_s && s.host_bytes > 0                 ? "host"
                                                                        : "device";
  s.tokens_per_second =
      s.seconds_per_step > 0 ? static_cast<double>(shape.micro_batch) / s.seconds_per_step : 0;
  return s;
}

}  // namespace zeroshard
