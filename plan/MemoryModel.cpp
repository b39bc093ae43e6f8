#include "plan/MemoryModel.h"

#include <algorithm>
#include <numeric>

#include "common/Alignment.h"
#include "common/Error.h"
#include "plan/OptimizerSplit.h"

namespace zeroshard {
namespace {

Tier tier_of(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::Cpu:
      return Tier::Host;
    case OffloadDevice::Nvme:
      return Tier::Nvme;
    default:
      return Tier::Device;
  }
}

bool offloaded(OffloadDevice d) {
  return d == OffloadDevice::Cpu || d == OffloadDevice::Nvme;
}

// Full parameters live on the device between a stage-3 gather and its free: the unit
// running plus what is prefetched, bounded by stage3_max_live_parameters but never
// below one whole unit; small units are never released (persistence threshold).
int64_t gathered_numel(const ModelSpec& spec, const ZeroConfig& z) {
  const int64_t unit = spec.largest_unit();
  const int64_t wanted =
      std::min(*z.stage3_max_live_parameters, unit + *z.stage3_prefetch_bucket_size);
  // Units at or below the persistence threshold are gathered once and stay
  // (sharding/ParamCoordinator.cpp release): the live budget covers the others. A spec
  // without units counts its small tensors.
  const int64_t threshold = *z.stage3_param_persistence_threshold;
  int64_t persistent = 0;
  for (size_t u = 0; u < spec.unit_params.size(); ++u)
    if (!spec.is_whole(u) && spec.unit_params[u] <= threshold) persistent += spec.unit_params[u];
  if (spec.unit_params.empty()) persistent = spec.persistent_params(threshold);
  const int64_t live = std::min(spec.total_params - persistent, std::max(unit, wanted));
  return live + persistent;
}

// hpZ: after forward each rank keeps its part of every unit that forward frees, sharded
// over the hpZ group. Units at or below the persistence threshold are never freed; the
// last unit of forward is not freed either, but which one that is depends on the run's
// order, so it is counted (an upper bound by one unit).
int64_t secondary_numel(const ModelSpec& spec, const ZeroConfig& z, int64_t ranks) {
  const int64_t parts = *z.hpz_partition_size;
  if (parts <= 1) return 0;
  int64_t total = 0;
  for (size_t u = 0; u < spec.unit_params.size(); ++u) {
    if (spec.is_whole(u) || spec.unit_params[u] <= *z.stage3_param_persistence_threshold) continue;
    total += padded_shard_numel(spec.unit_params[u], ranks) * ranks / parts;
  }
  return total;
}

}  // namespace

ParamPlacement place_param_shards(const ModelSpec& spec, OffloadDevice device, int64_t max_in_cpu,
                                  int64_t ranks, int64_t compute_bytes,
                                  const QuantizedLayout& quantized) {
  ParamPlacement p;
  int64_t kept = 0;  // nvme: shards held in host RAM, in unit order, up to max_in_cpu
  for (size_t u = 0; u < spec.unit_params.size(); ++u) {
    if (spec.is_whole(u)) continue;
    const int64_t r = spec.sharding_ranks(u, ranks);
    const int64_t n = padded_shard_numel(spec.unit_params[u], r);
    // A frozen shard is kept quantized where weight_quantization asks (sharding/ShardQuantizer.h).
    const int64_t bytes =
        quantized.bits > 0 && spec.is_frozen(u)
            ? quantized.shard_bytes_bound(n, n * r, spec.quantizable(u), compute_bytes)
            : compute_bytes * n;
    p.largest_shard = std::max(p.largest_shard, n);
    if (device == OffloadDevice::Cpu || device == OffloadDevice::Nvme)
      p.largest_offloaded_shard = std::max(p.largest_offloaded_shard, n);
    if (device == OffloadDevice::Cpu) {
      p.host_numel += n;
      p.host_bytes += bytes;
    } else if (device != OffloadDevice::Nvme) {
      p.device_numel += n;
      p.device_bytes += bytes;
    } else if (kept + n <= max_in_cpu) {
      kept += n;
      p.host_numel += n;
      p.host_bytes += bytes;
      p.in_host.push_back(u);
    } else {
      p.nvme_numel += n;
      p.nvme_bytes += round_up(bytes, kIoAlignment);  // each shard its own swap region
      if (!spec.is_frozen(u)) p.trainable_nvme_numel += n;
      p.nvme_shards.push_back(n);
      p.largest_nvme_shard = std::max(p.largest_nvme_shard, n);
      p.largest_nvme_bytes = std::max(p.largest_nvme_bytes, bytes);
    }
  }
  return p;
}

std::string PlanOption::label() const {
  std::string text = fmt::format("stage {}", stage);
  if (offloaded(optimizer)) text += fmt::format(", optimizer {}", offload_device_name(optimizer));
  if (offloaded(params)) text += fmt::format(", params {}", offload_device_name(params));
  if (kv_cache_on_host) text += ", KV cache in host RAM";
  return text;
}

int64_t MemoryBreakdown::total(Tier tier) const {
  int64_t sum = 0;
  for (size_t k = 0; k < kNumKinds; ++k) sum += at(tier, static_cast<Kind>(k));
  return sum;
}

int64_t shard_numel(const ModelSpec& spec, int64_t ranks) {
  int64_t total = 0;
  for (size_t u = 0; u < spec.unit_params.size(); ++u)
    total += padded_shard_numel(spec.unit_params[u], spec.sharding_ranks(u, ranks));
  return total;
}

namespace {

int64_t full_numel_of(const ModelSpec& spec, int64_t ranks, bool trainable_only) {
  int64_t total = 0;
  for (size_t u = 0; u < spec.unit_params.size(); ++u) {
    if (trainable_only && spec.is_frozen(u)) continue;
    const int64_t r = spec.sharding_ranks(u, ranks);
    total += padded_shard_numel(spec.unit_params[u], r) * r;
  }
  return total;
}

}  // namespace

int64_t full_numel(const ModelSpec& spec, int64_t ranks) {
  return full_numel_of(spec, ranks, false);
}

int64_t trainable_full_numel(const ModelSpec& spec, int64_t ranks) {
  return full_numel_of(spec, ranks, true);
}

int64_t trainable_shard_numel(const ModelSpec& spec, int64_t ranks) {
  const std::vector<int64_t> numels = trainable_shard_numels(spec, ranks);
  return std::accumulate(numels.begin(), numels.end(), int64_t{0});
}

int64_t sharding_ranks(const Config& config, int stage, int64_t ranks) {
  const int64_t mics = *config.zero.mics_shard_size;
  return stage >= 1 && mics > 0 ? std::min(mics, ranks) : ranks;
}

double split_ratio(const PlanOption& option, const Config& config) {
  const auto& ratio = config.zero.offload_optimizer.ratio;
  const bool splits = option.stage == 3 && option.optimizer == OffloadDevice::Cpu;
  return splits && ratio ? *ratio : 1.0;
}

int64_t resident_optimizer_numel(const ModelSpec& spec, const PlanOption& option,
                                 const Config& config, int64_t ranks) {
  const double ratio = split_ratio(option, config);
  if (ratio >= 1) return 0;
  const std::vector<int64_t> numels = trainable_shard_numels(spec, ranks);
  const std::vector<bool> on_host = optimizer_on_host(numels, ratio);
  int64_t resident = 0;
  for (size_t i = 0; i < numels.size(); ++i)
    if (!on_host[i]) resident += numels[i];
  return resident;
}

std::vector<int64_t> trainable_shard_numels(const ModelSpec& spec, int64_t ranks) {
  std::vector<int64_t> numels;
  for (size_t u = 0; u < spec.unit_params.size(); ++u) {
    if (!spec.is_frozen(u))
      numels.push_back(padded_shard_numel(spec.unit_params[u], spec.sharding_ranks(u, ranks)));
  }
  return numels;
}

namespace {

// Bytes per element a gradient reduction holds in flight: its receive buffer in the
// gradients' own dtype, or, reduced in another (communication_data_type), the cast copy
// and the receive buffer in that dtype (sharding/Collectives.cpp).
int64_t reduce_scratch_bytes(const Config& config) {
  const std::string& wire = config.communication_data_type;
  const int64_t kl = config.compute_bytes();
  const int64_t kw = wire == "fp32" ? 4 : (wire == "bf16" || wire == "fp16") ? 2 : kl;
  return kw == kl ? kl : 2 * kw;
}

}  // namespace

MemoryBreakdown predict_memory(const ModelSpec& spec, const PlanOption& option,
                               const Config& config, const WorldShape& world,
                               const TrainingShape& shape) {
  const ZeroConfig& z = config.zero;
  // Everything below is per shard group: MiCS replicates the states across groups.
  const int64_t d = sharding_ranks(config, option.stage, world.data_parallel_ranks());
  const int64_t kl = config.compute_bytes();
  const bool mixed = kl == 2;
  // flat buffers hold every unit padded to d aligned shards (an expert unit to d / ep)
  const int64_t full = full_numel(spec, d);
  // Gradients and optimizer state: trainable units only.
  const int64_t trained = trainable_shard_numel(spec, d);
  const int64_t trained_full = trainable_full_numel(spec, d);
  const int64_t opt_numel = option.stage >= 1 ? trained : trained_full;  // this rank's optimizer
  const bool opt_off = offloaded(option.optimizer);
  const Tier opt_tier = tier_of(option.optimizer);
  // Buckets reduce gradients (and stages 1-2 gather updated parameters): trained ones only.
  const int64_t trained_params = spec.trainable_params();
  const int64_t reduce_bucket = std::min(*z.reduce_bucket_size, trained_params);

  MemoryBreakdown m;
  const ParamPlacement placed =
      place_param_shards(spec, option.params, z.offload_param.max_in_cpu.value_or(0), d, kl,
                         config.weight_quantization.layout());
  if (option.stage == 3) {
    int64_t whole = 0;  // units kept whole, in full
    for (size_t u = 0; u < spec.unit_params.size(); ++u)
      if (spec.is_whole(u)) {
        const int64_t r = spec.sharding_ranks(u, d);
        whole += padded_shard_numel(spec.unit_params[u], r) * r;
      }
    // Construction (engine/EngineBuilder.cpp): an offloaded unit's shard is cut on the
    // device before it leaves for its tier, one at a time; a trainable one bound for NVMe
    // waits in memory (the host's beside a GPU) until the optimizer has read it.
    // A quantized shard is cut on the device too, before it is encoded.
    const bool quantized = config.weight_quantization.enabled();
    const int64_t cut = offloaded(option.params) ? placed.largest_offloaded_shard
                        : quantized              ? placed.largest_shard
                                                 : 0;
    const int64_t waiting = placed.trainable_nvme_numel;
    const int64_t on_device = shape.device_is_host ? std::max(cut, waiting) : cut;
    m.at(Tier::Device, Kind::Params) = kl * (whole + on_device) + placed.device_bytes;
    m.at(Tier::Host, Kind::Params) = placed.host_bytes + (shape.device_is_host ? 0 : kl * waiting);
    m.at(Tier::Nvme, Kind::Params) = placed.nvme_bytes;  // regions aligned for O_DIRECT
    m.at(Tier::Device, Kind::GatheredParams) = kl * gathered_numel(spec, z);
    if (option.params == OffloadDevice::None)
      m.at(Tier::Device, Kind::SecondaryParams) = kl * secondary_numel(spec, z, d);
  } else {
    m.at(Tier::Device, Kind::Params) = kl * full;
  }
  // The optimizer updates fp32 weights: a separate master copy in mixed precision,
  // and the host/NVMe copy CPU Adam works on when offloaded.
  // A torch.optim class keeps its masters in host RAM and pages only its state.
  const bool paged_external = config.optimizer.external && option.optimizer == OffloadDevice::Nvme;
  // offload_optimizer.ratio < 1: the shards kept on the device hold there what the
  // optimizer on the device would (plan/OptimizerSplit.h); the rest is offloaded.
  const int64_t resident = resident_optimizer_numel(spec, option, config, d);
  const int64_t off_numel = opt_numel - resident;
  if (mixed || opt_off)
    m.at(paged_external ? Tier::Host : opt_tier, Kind::MasterParams) = 4 * off_numel;
  if (mixed && resident > 0) m.at(Tier::Device, Kind::MasterParams) = 4 * resident;
  // Adam's m and v (8 bytes), or what the torch.optim class keeps (config/TorchOptimizers.h).
  const OptimizerConfig& o = config.optimizer;
  m.at(opt_tier, Kind::OptimizerStates) = o.state_bytes * off_numel + o.state_whole_bytes +
                                          o.state_sharded_bytes / (option.stage >= 1 ? d : 1);
  if (resident > 0) m.at(Tier::Device, Kind::OptimizerStates) = o.state_bytes * resident;
  // Stage >= 2 reduces each bucket inside backward and frees it: no whole gradient
  // buffer at rest, only an fp32 accumulator of this rank's shard.
  m.at(Tier::Device, Kind::Grads) =
      option.stage >= 2 && !shape.grads_held_in_window ? 0 : kl * trained_full;
  if (opt_off) {
    m.at(Tier::Host, Kind::GradsFp32) = 4 * off_numel;
    if (resident > 0) m.at(Tier::Device, Kind::GradsFp32) = 4 * resident;  // stage 3
  } else if (mixed || option.stage >= 2) {
    m.at(Tier::Device, Kind::GradsFp32) = 4 * opt_numel;
  }
  TrainingShape t = shape;
  t.kv_cache_on_host = shape.inference && option.kv_cache_on_host;
  t.recomputed = recomputed_layers(spec, config, shape);
  if (offloaded(config.activation_offload.device))
    t.activation_offload = tier_of(config.activation_offload.device);
  m.at(Tier::Device, Kind::Activations) = activation_bytes(spec, t, static_cast<int>(kl));
  if (const int64_t off = offloaded_activation_bytes(spec, t, static_cast<int>(kl))) {
    m.at(t.activation_offload, Kind::Activations) += off;
    // NVMe: each block's bytes pass through host RAM on their way out and back.
    if (t.activation_offload == Tier::Nvme)
      m.at(Tier::Host, Kind::Activations) += offload_staging_bytes(spec, t, static_cast<int>(kl));
  }
  if (t.kv_cache_on_host) m.at(Tier::Host, Kind::Activations) = kv_cache_bytes(spec, t, kl);
  m.at(Tier::Device, Kind::Buffers) = spec.buffer_bytes;  // whole on every rank, never offloaded
  int64_t buckets = reduce_scratch_bytes(config) * reduce_bucket * (z.overlap_comm ? 2 : 1);
  if (option.stage == 1 || option.stage == 2)
    buckets += kl * std::min(*z.allgather_bucket_size, trained_params);
  m.at(Tier::Device, Kind::CommBuckets) = buckets;

  int64_t pinned = 0;
  if (opt_off && opt_numel > 0 && !shape.device_is_host && !config.optimizer.external) {
    // The updated shards' way back to the GPU: two slots of the largest part CPU Adam
    // steps at once (a group's shard, or a sub-group of it on NVMe). A group holds a
    // unit or a bucket of at most reduce_bucket elements (one larger tensor alone).
    const int64_t group = std::max(spec.largest_unit(), reduce_bucket);
    int64_t part = padded_shard_numel(group, d);
    if (option.optimizer == OffloadDevice::Nvme) part = std::min(*z.sub_group_size, part);
    pinned += 2 * round_up(kl * part, kIoAlignment);
  }
  if (option.optimizer == OffloadDevice::Nvme && opt_numel > 0) {
    // Each swap slot holds one sub-group's master, m and v (a torch.optim class's: its
    // state arrays); sub-groups split each unit's shard.
    const int64_t largest_shard = option.stage >= 1 ? padded_shard_numel(spec.largest_unit(), d)
                                                    : padded_shard_numel(spec.largest_unit(), 1);
    const int64_t per_element = paged_external ? config.optimizer.state_bytes : 12;
    const int64_t slot = std::min(*z.sub_group_size, largest_shard) * per_element;
    const int64_t aligned_slot = round_up(slot, kIoAlignment);
    pinned += *z.offload_optimizer.buffer_count * aligned_slot;
  }
  if (placed.nvme_numel > 0) {
    const int64_t aligned_slot = round_up(placed.largest_nvme_bytes, kIoAlignment);
    pinned += *z.offload_param.buffer_count * aligned_slot;
  }
  m.at(Tier::Host, Kind::PinnedBuffers) = pinned;
  return m;
}

}  // namespace zeroshard
