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

namespace {

// One head's width, and the keys' (or values') width of a token: kv heads x head width.
int64_t head_width(const ModelSpec& spec) {
  return spec.head_dim > 0 ? spec.head_dim : spec.hidden / spec.heads;
}

int64_t kv_width(const ModelSpec& spec) {
  return (spec.kv_heads > 0 ? spec.kv_heads : spec.heads) * head_width(spec);
}

// Bytes one token's pass through a norm keeps for backward: its input (an fp32 copy where
// the norm computes in fp32) and its normalised output, which the next linear keeps too.
int64_t norm_bytes(const ModelSpec& spec, int64_t kl) {
  return spec.hidden * (spec.norm_fp32_input ? 4 + 2 * kl : 2 * kl);
}

// One block, per token, at sequence length s (docs/memory-model.md "Activations").
int64_t block_bytes(const ModelSpec& spec, int64_t s, int64_t kl) {
  const int64_t h = spec.hidden, a = spec.heads;
  const int64_t head_dim = head_width(spec);
  const int64_t kv = kv_width(spec);
  const int64_t inner = spec.intermediate > 0 ? spec.intermediate : 4 * h;
  // A fused kernel keeps queries, keys, values, its output (the output projection's input)
  // and an fp32 log-sum-exp per head. Eager attention repeats keys and values to every
  // head, copies the output for the projection, and keeps its fp32 softmax and the
  // compute-precision copy the values multiply.
  int64_t attention = spec.attention_scores ? kl * 4 * a * head_dim + (kl + 4) * a * s
                                            : kl * (2 * a * head_dim + 2 * kv) + 4 * a;
  if (spec.cache_copies_kv) attention += kl * 2 * kv;
  int64_t mlp = spec.mlp_tensors * kl * inner;
  // Routed: each token's MLP runs in k experts, on a gathered copy of its input, and
  // each expert's output is kept for its routing weight.
  if (spec.experts_per_token > 0) mlp = spec.experts_per_token * (mlp + 2 * kl * h);
  return spec.norms_per_block * norm_bytes(spec, kl) + attention + mlp;
}

// What Ulysses adds to a block, per token of a rank's slice, over `sp` ranks: attention
// runs on the exchanged queries, keys and values and the output is exchanged back, so the
// output projection keeps its input besides the kernel's output (one more a x head_dim),
// and keys and values fewer than the ranks are repeated to one head per rank before the
// exchange (2 x (sp - kv heads) x head_dim more than the block's own).
int64_t ulysses_bytes(const ModelSpec& spec, int64_t sp, int64_t kl) {
  if (sp <= 1) return 0;
  const int64_t head_dim = head_width(spec);
  const int64_t kv_heads = spec.kv_heads > 0 ? spec.kv_heads : spec.heads;
  return kl * (spec.heads * head_dim + 2 * std::max<int64_t>(0, sp - kv_heads) * head_dim);
}

// What a block under the "op" policy keeps per token: its input and the outputs of its
// matmuls and attention kernel (torch's selective checkpoint saves them; the norms,
// rotations, activations and products between are recomputed): queries, keys and values,
// the kernel's output and fp32 log-sum-exp per head (eager attention: its scores and their
// product with the values), the output projection, the MLP's matmuls onto the
// intermediate width and back (in each of k experts, beside the router's logits).
int64_t saved_ops_bytes(const ModelSpec& spec, int64_t s, int64_t kl) {
  const int64_t h = spec.hidden, a = spec.heads, head_dim = head_width(spec);
  const int64_t inner = spec.intermediate > 0 ? spec.intermediate : 4 * h;
  const int64_t attention =
      spec.attention_scores ? kl * (a * s + a * head_dim) : kl * a * head_dim + 4 * a;
  int64_t mlp = kl * (spec.mlp_matmuls * inner + h);
  if (spec.experts_per_token > 0) mlp = spec.experts_per_token * mlp + kl * spec.experts;
  return kl * (2 * h + a * head_dim + 2 * kv_width(spec)) + attention + mlp;
}

}  // namespace

int64_t kv_cache_bytes(const ModelSpec& spec, const TrainingShape& t, int kl) {
  if (!spec.has_shape()) return 0;
  return 2 * spec.layers * t.micro_batch * t.seq * kv_width(spec) * kl;
}

namespace {

// The blocks' saved activations, per micro-batch: `kept` in all, `largest` in one block.
struct KeptBlocks {
  int64_t kept = 0;
  int64_t largest = 0;
  int64_t recomputed = 0;  // one block's, while backward recomputes it
};

KeptBlocks kept_blocks(const ModelSpec& spec, const TrainingShape& t, int kl) {
  const int64_t sp = std::max<int64_t>(1, t.sequence_parallel);
  const int64_t s = t.seq / sp, b = t.micro_batch, L = spec.layers;
  const int64_t per_layer = s * b * (block_bytes(spec, t.seq, kl) + ulysses_bytes(spec, sp, kl));
  // Checkpointed: a block recomputed whole keeps only its input, one under the "op" policy
  // its saved ops' outputs; backward recomputes one block at a time.
  const int64_t whole = t.activation_checkpointing ? L : std::min(L, t.recomputed.whole);
  const int64_t ops = std::min(L - whole, t.recomputed.ops);
  const int64_t input = s * b * spec.hidden * kl,
                saved_ops = s * b * saved_ops_bytes(spec, t.seq, kl);
  KeptBlocks k;
  k.kept = (L - whole - ops) * per_layer + whole * input + ops * saved_ops;
  k.largest = L > whole + ops ? per_layer : ops > 0 ? saved_ops : input;
  k.recomputed = whole + ops > 0 ? per_layer : 0;
  return k;
}

bool offloads(const TrainingShape& t) {
  return t.activation_offload != Tier::Device && !t.inference && t.part_steps.empty() &&
         t.pipeline_micro_batches == 0;
}

}  // namespace

int64_t offloaded_activation_bytes(const ModelSpec& spec, const TrainingShape& t, int kl) {
  if (!spec.has_shape() || !offloads(t)) return 0;
  return kept_blocks(spec, t, kl).kept;
}

int64_t activation_bytes(const ModelSpec& spec, const TrainingShape& t, int kl) {
  if (!spec.has_shape()) return 0;
  // s: the tokens this rank holds of each sequence; attention still spans t.seq.
  const int64_t sp = std::max<int64_t>(1, t.sequence_parallel);
  const int64_t s = t.seq / sp, b = t.micro_batch, L = spec.layers;
  // Served: nothing is kept for backward. The KV cache, and while the prompt runs one
  // block's temporaries (at most what it would keep for backward) and the last position's
  // logits (generate computes no others), in the compute dtype and in fp32. A KV cache in
  // host RAM leaves three layers' on the device: the running layer's, its copy grown by the
  // new token, and the next layer's, fetched ahead.
  if (t.inference) {
    const int64_t kv = kv_cache_bytes(spec, t, kl);
    return (t.kv_cache_on_host ? kv / L * std::min<int64_t>(3, L) : kv) +
           s * b * block_bytes(spec, s, kl) + (spec.has_head ? b * spec.vocab * (kl + 4) : 0);
  }
  // The final norm, then the logits in compute precision (the model's output) and the
  // fp32 log-probabilities the loss keeps.
  const int64_t head = spec.has_head ? s * b * (norm_bytes(spec, kl) + spec.vocab * (kl + 4)) : 0;
  // A pipeline stage holds several micro-batches' (TrainingShape::in_flight), and outputs
  // no op of its own saves: the schedule keeps each in-flight micro-batch's output (the
  // hidden states sent on) for its backward, and on the last stage every micro-batch's
  // logits until step() returns them (those in flight are in `head` already).
  const int64_t held = std::max<int64_t>(1, t.in_flight);
  int64_t outputs = 0;
  if (t.pipeline_micro_batches > 0) {
    outputs = spec.has_head ? (t.pipeline_micro_batches - held) * s * b * spec.vocab * kl
                            : held * s * b * spec.hidden * kl;
  }
  const KeptBlocks blocks = kept_blocks(spec, t, kl);
  const int64_t kept_layers = blocks.kept, recomputed = blocks.recomputed;
  // Offloaded: two blocks' on the device at most, the one whose backward runs (or whose
  // copies out are still in flight in forward) and the one fetched ahead of it.
  if (offloads(t)) return head + recomputed + 2 * blocks.largest;
  if (!t.part_steps.empty()) {
    // Several stages on the rank: a micro-batch in flight on one holds its blocks' (and its
    // output, or the head's); the head's stage keeps the logits of every micro-batch it
    // ran until step() returns them. The peak is the step that holds the most.
    int64_t peak = 0;
    for (const PartsStep& step : t.part_steps) {
      int64_t bytes = 0;
      for (size_t p = 0; p < t.part_layers.size(); ++p) {
        const bool ends_in_head = static_cast<int64_t>(p) == t.head_part;
        const int64_t each = kept_layers / std::max<int64_t>(1, L) * t.part_layers[p] +
                             (ends_in_head ? head : s * b * spec.hidden * kl);
        bytes += step.held[p] * each;
        if (ends_in_head) bytes += (step.forwarded[p] - step.held[p]) * s * b * spec.vocab * kl;
      }
      peak = std::max(peak, bytes);
    }
    return peak + recomputed;
  }
  return held * (kept_layers + head) + recomputed + outputs;
}

Recomputed recomputed_layers(const ModelSpec& spec, const Config& config,
                             const TrainingShape& shape) {
  const std::string& mode = config.activation_checkpointing_mode;
  const int64_t layers = spec.layers;
  Recomputed r;
  if (shape.inference || mode == "none") return r;
  if (mode == "full") {
    r.whole = layers;
  } else if (mode == "selective") {
    const std::string& option = config.selective_ac_option;
    if (option.empty() || option == "op") {
      r.ops = layers;
    } else {
      r.whole = layers / std::stoll(option);  // blocks N, 2N, ...
    }
  } else if (mode == "memory_budget") {
    const int kl = static_cast<int>(config.compute_bytes());
    TrainingShape t = shape;
    t.recomputed = {};
    const double budget = config.activation_memory_budget.value_or(0.5) *
                          static_cast<double>(activation_bytes(spec, t, kl));
    for (r.whole = 0; r.whole < layers; ++r.whole) {
      t.recomputed.whole = r.whole;
      if (static_cast<double>(activation_bytes(spec, t, kl)) <= budget) break;
    }
  }
  return r;
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
      m.at(Tier::Host, Kind::Activations) += 2 * kept_blocks(spec, t, static_cast<int>(kl)).largest;
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
