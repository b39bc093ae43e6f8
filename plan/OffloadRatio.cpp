#include "plan/OffloadRatio.h"

#include <fmt/format.h>

#include "common/Bytes.h"
#include "plan/OptimizerSplit.h"

namespace zeroshard {

using OD = OffloadDevice;

// offload_optimizer.ratio auto for `option`: where the optimizer is on the host at stage 3,
// the ratio that keeps the most shards on the device that its memory holds, and the bytes
// with it; elsewhere ratio 1.
void fill_offload_ratio(OptionEstimate& e, const ModelSpec& spec, const Config& resolved,
                        const WorldShape& world, const TrainingShape& shape,
                        const HardwareBudget& b) {
  Config c = resolved;
  auto& ratio = c.zero.offload_optimizer.ratio;
  const PlanOption& o = e.option;
  const bool splits = o.stage == 3 && o.optimizer == OD::Cpu && o.params == OD::None &&
                      !resolved.optimizer.external && resolved.optimizer.type != "Lamb" &&
                      resolved.zero.offload_optimizer.overlap_step != "true";
  ratio = 1.0;
  e.bytes = predict_memory(spec, o, c, world, shape);
  e.ratio = 1.0;
  if (!splits) return;
  const auto usable_device = static_cast<int64_t>(b.device_bytes * (1.0 - b.headroom));
  const std::vector<int64_t> numels =
      trainable_shard_numels(spec, sharding_ranks(resolved, o.stage, world.data_parallel_ranks()));
  for (size_t first = numels.size(); first > 0; --first) {  // the most on the device first
    ratio = ratio_from(numels, first);
    MemoryBreakdown bytes = predict_memory(spec, o, c, world, shape);
    if (bytes.total(Tier::Device) > usable_device) continue;
    e.bytes = bytes;
    e.ratio = ratio;
    return;
  }
}

void resolve_offload_ratio(Plan& plan, const OptionEstimate& chosen) {
  const double ratio = chosen.ratio.value_or(1.0);
  plan.config.zero.offload_optimizer.ratio = ratio;
  const char* path = "zero_optimization.offload_optimizer.ratio";
  if (chosen.option.optimizer == OD::None) return;  // nothing to say: nothing is offloaded
  if (ratio >= 1) {
    const PlanOption& o = chosen.option;
    const OptimizerConfig& opt = plan.config.optimizer;
    std::string why = "the device has no room for any shard's state besides the rest";
    if (o.stage != 3 || o.optimizer != OD::Cpu || o.params != OD::None) {
      why =
          "only stage 3 with the optimizer on the host and the parameters on the device "
          "keeps part of it there";
    } else if (opt.external || opt.type == "Lamb") {
      why = fmt::format("optimizer {} steps on one side only", opt.type);
    } else if (plan.config.zero.offload_optimizer.overlap_step == "true") {
      why = "overlap_step true steps every shard on the host inside backward";
    }
    plan.reasons.push_back(fmt::format(
        "{}: auto -> 1 (every optimizer shard steps on the offload device: {})", path, why));
    return;
  }
  const int64_t resident = chosen.bytes.at(Tier::Device, Kind::OptimizerStates) +
                           chosen.bytes.at(Tier::Device, Kind::MasterParams) +
                           chosen.bytes.at(Tier::Device, Kind::GradsFp32);
  plan.reasons.push_back(fmt::format(
      "{}: auto -> {:.6g} (the optimizer's first shards step on the device, {} GiB of master "
      "weights, state and fp32 gradients there, as much as the device holds; the rest on the "
      "host)",
      path, ratio, format_gib(static_cast<double>(resident))));
}

}  // namespace zeroshard
