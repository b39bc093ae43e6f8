#include "plan/Planner.h"

#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/Bytes.h"
#include "common/Error.h"
#include "plan/AutoKnobs.h"
#include "plan/OffloadRatio.h"
#include "plan/ServingStream.h"

namespace zeroshard {
namespace {

using OD = OffloadDevice;

// Model states all on the device: neither the optimizer nor the parameters offloaded.
bool on_device(const PlanOption& o) {
  return o.optimizer == OD::None && o.params == OD::None;
}

bool permitted(const Config& c, const PlanOption& o) {
  if (c.zero.stage && *c.zero.stage != o.stage) return false;
  const auto& mics = c.zero.mics_shard_size;
  if (mics && *mics > 0 && o.stage == 0) return false;  // groups shard at stages 1-3
  // hpZ's secondary copy is of stage 3's parameters, in device memory.
  const auto& hpz = c.zero.hpz_partition_size;
  if (hpz && *hpz > 1 && (o.stage != 3 || o.params != OD::None)) return false;
  const OD opt = c.zero.offload_optimizer.device;
  const OD par = c.zero.offload_param.device;
  // Lamb and Adafactor step state in memory; elementwise torch.optim classes page theirs
  // through NVMe; only zeroshard's Adam brings NVMe parameter shards in for its update
  // (engine/EngineBuilder.cpp).
  const bool in_memory =
      (c.optimizer.external && !c.optimizer.elementwise) || c.optimizer.type == "Lamb";
  if (in_memory && o.optimizer == OD::Nvme) return false;
  if ((c.optimizer.external || c.optimizer.type == "Lamb") && o.params == OD::Nvme) return false;
  // Part of the optimizer on the device steps where the parameters are (config/Config.h).
  const auto& ratio = c.zero.offload_optimizer.ratio;
  if (ratio && *ratio < 1 && (o.stage != 3 || o.params != OD::None)) return false;
  // Experts split over ranks: parameters stay on the device, and the optimizer's offload
  // needs its shards (engine/ExpertParallel.h).
  if (c.expert_parallel_size > 1 &&
      (o.params != OD::None || (o.stage == 0 && o.optimizer != OD::None)))
    return false;
  return (opt == OD::Auto || opt == o.optimizer) && (par == OD::Auto || par == o.params);
}

void judge(OptionEstimate& e, const WorldShape& world, const HardwareBudget& b) {
  const double keep = 1.0 - b.headroom;
  const int64_t device = e.bytes.total(Tier::Device);
  const int64_t host = e.bytes.total(Tier::Host) * world.ranks_per_node;
  const int64_t nvme = e.bytes.total(Tier::Nvme) * world.ranks_per_node;
  const auto usable_device = static_cast<int64_t>(b.device_bytes * keep);
  const auto usable_host = static_cast<int64_t>(b.host_bytes * keep);
  std::vector<std::string> short_by;
  e.overflow_bytes = 0;
  auto check = [&](int64_t need, int64_t have, const char* what, int64_t per) {
    if (need <= have) return;
    e.overflow_bytes += (need - have) * (per == 1 ? world.ranks_per_node : 1);
    short_by.push_back(fmt::format("{} short by {} GiB{}", what,
                                   format_gib(static_cast<double>(need - have)),
                                   per == 1 ? "/rank" : "/node"));
  };
  check(device, usable_device, "device", 1);
  check(host, usable_host, "host", 0);
  check(nvme, b.nvme_bytes, "nvme", 0);
  e.fits = short_by.empty();
  e.verdict = e.fits ? "fits" : fmt::format("{}", fmt::join(short_by, "; "));
}

void apply_choice(Plan& plan, const OptionEstimate& chosen) {
  plan.option = chosen.option;
  plan.predicted = chosen.bytes;
  auto& z = plan.config.zero;
  z.stage = chosen.option.stage;
  z.offload_optimizer.device = chosen.option.optimizer;
  z.offload_param.device = chosen.option.params;
  if (!z.offload_optimizer.ratio) resolve_offload_ratio(plan, chosen);
  for (auto* path : {&z.offload_optimizer.nvme_path, &z.offload_param.nvme_path}) {
    if (path->empty()) *path = "/local_nvme";
  }
  const bool nvme_path_placeholder = plan.config.activation_offload.device == OD::Nvme &&
                                     plan.config.activation_offload.nvme_path == "/local_nvme";
  if (chosen.option.optimizer == OD::Nvme || chosen.option.params == OD::Nvme ||
      nvme_path_placeholder) {
    plan.reasons.push_back(
        "nvme_path: /local_nvme is a placeholder; point it at a directory "
        "on a local NVMe file system");
  }
}

// When activations are most of the device bytes, say what checkpointing would save.
std::string activation_hint(const ModelSpec& spec, const Config& c, const MemoryBreakdown& m,
                            const TrainingShape& shape) {
  const int64_t activations = m.at(Tier::Device, Kind::Activations);
  if (shape.inference || shape.activation_checkpointing ||
      c.activation_checkpointing_mode != "none" || 2 * activations < m.total(Tier::Device))
    return "";
  TrainingShape checkpointed = shape;
  checkpointed.activation_checkpointing = true;
  const int64_t smaller = activation_bytes(spec, checkpointed, c.compute_bytes());
  return fmt::format("; activations are {} GiB of it, {} GiB with activation checkpointing",
                     format_gib(static_cast<double>(activations)),
                     format_gib(static_cast<double>(smaller)));
}

// The config's fixed keys rule out every choice (parameter offload with the optimizer
// on the device, hpZ with parameter offload left open, ...): say which keys, and what
// zeroshard runs.
[[noreturn]] void refuse_fixed_keys(const Config& c) {
  std::vector<std::string> keys;
  if (c.zero.stage) keys.push_back(fmt::format("'zero_optimization.stage' {}", *c.zero.stage));
  if (c.zero.offload_optimizer.device != OD::Auto) {
    keys.push_back(fmt::format("'zero_optimization.offload_optimizer.device' '{}'",
                               offload_device_name(c.zero.offload_optimizer.device)));
  }
  if (c.zero.offload_param.device != OD::Auto) {
    keys.push_back(fmt::format("'zero_optimization.offload_param.device' '{}'",
                               offload_device_name(c.zero.offload_param.device)));
  }
  const auto& mics = c.zero.mics_shard_size;
  if (mics && *mics > 0)
    keys.push_back(fmt::format("'zero_optimization.mics_shard_size' {}", *mics));
  const auto& hpz = c.zero.hpz_partition_size;
  if (hpz && *hpz > 1) {
    keys.push_back(fmt::format("'zero_optimization.zero_hpz_partition_size' {}", *hpz));
  }
  std::vector<std::string> runs;
  for (const auto& option : plan_options()) runs.push_back(option.label());
  fail(
      "config keys {} together leave no stage and offload choice zeroshard runs; allowed: {} "
      "(parameters are offloaded only at stage 3, with the optimizer offloaded too)",
      fmt::join(keys, ", "), fmt::join(runs, "; "));
}

// The options judged under `resolved`, the first allowed one that fits (-1: none) and
// the allowed one closest to fitting.
struct Choice {
  std::vector<OptionEstimate> options;
  int chosen = -1;
  int closest = -1;
};

Choice choose(const ModelSpec& spec, const Config& fixed, const Config& resolved,
              const WorldShape& world, const TrainingShape& shape, const HardwareBudget& budget) {
  Choice c;
  const bool auto_policy = resolved.activation_checkpointing_mode == "auto" && !shape.inference;
  for (const auto& option : plan_options()) {
    if (spec.all_frozen() && !serving_option(option, fixed)) continue;
    OptionEstimate e;
    e.option = option;
    TrainingShape at = shape;
    if (auto_policy) {
      at.recomputed = fewest_recomputed(spec, option, resolved, world, shape, budget);
      e.recomputed = at.recomputed.whole;
    }
    if (resolved.zero.offload_optimizer.ratio) {
      e.bytes = predict_memory(spec, option, resolved, world, at);
    } else {
      fill_offload_ratio(e, spec, resolved, world, at, budget);
    }
    e.allowed = permitted(fixed, option);
    judge(e, world, budget);
    c.options.push_back(e);
  }
  const auto pick = [&c, auto_policy] {
    for (size_t i = 0; i < c.options.size(); ++i) {
      const auto& e = c.options[i];
      if (!e.allowed) continue;
      if (e.fits && c.chosen < 0) c.chosen = static_cast<int>(i);
      if (c.closest < 0 || e.overflow_bytes < c.options[c.closest].overflow_bytes)
        c.closest = static_cast<int>(i);
    }
    // Mode auto: recomputing costs at most one more forward, offloading the optimizer moves
    // its step to the host every step; so among the options that keep everything on the
    // device, the one that recomputes fewest blocks (the earlier where they tie), and the
    // offloading ones only where none of those fits even recomputing every block.
    if (!auto_policy || c.chosen < 0) return;
    for (size_t i = 0; i < c.options.size(); ++i) {
      const auto& e = c.options[i];
      if (e.allowed && e.fits && on_device(e.option) &&
          *e.recomputed < *c.options[c.chosen].recomputed)
        c.chosen = static_cast<int>(i);
    }
  };
  pick();
  // Served, and nothing fits with the KV cache on the device: in host RAM where that fits
  // (or comes closer).
  if (c.chosen < 0 && shape.inference) {
    for (auto& e : c.options) {
      OptionEstimate host = e;
      host.option.kv_cache_on_host = true;
      host.bytes = predict_memory(spec, host.option, resolved, world, shape);
      judge(host, world, budget);
      if (host.fits || host.overflow_bytes < e.overflow_bytes) e = host;
    }
    c.closest = -1;
    pick();
  }
  if (c.closest < 0) refuse_fixed_keys(fixed);
  return c;
}

void check_mics_world(const Config& c, const WorldShape& world) {
  const auto& mics = c.zero.mics_shard_size;
  if (!mics || *mics < 1) return;
  const int64_t ranks = world.data_parallel_ranks();
  if (*mics > ranks || ranks % *mics != 0) {
    fail(
        "config key 'zero_optimization.mics_shard_size' is {} with {} data-parallel ranks; "
        "allowed: -1, auto, or a group size that divides {} (per node: {})",
        *mics, ranks, ranks, world.data_parallel_per_node());
  }
}

void check_hpz_world(const Config& c, const WorldShape& world) {
  const auto& hpz = c.zero.hpz_partition_size;
  if (!hpz || *hpz <= 1) return;
  const int64_t ranks = world.data_parallel_ranks();
  if (*hpz > ranks || ranks % *hpz != 0) {
    fail(
        "config key 'zero_optimization.zero_hpz_partition_size' is {} with {} data-parallel "
        "ranks; allowed: 1, auto, or a group size that divides {} (per node: {})",
        *hpz, ranks, ranks, world.data_parallel_per_node());
  }
}

// The first allowed option that fits, else the closest.
int best_of(const Choice& c) {
  return c.chosen < 0 ? c.closest : c.chosen;
}

// mics_shard_size auto: one shard group per node where there is more than one node and
// that costs no offload the shard-everywhere plan avoids; otherwise every rank.
void resolve_mics(const ModelSpec& spec, const Config& fixed, const WorldShape& world,
                  const TrainingShape& shape, const HardwareBudget& budget, Plan& plan,
                  Choice& choice) {
  const char* path = "zero_optimization.mics_shard_size";
  const int64_t per_node = world.data_parallel_per_node();
  auto everywhere = [&](const std::string& why) {
    plan.config.zero.mics_shard_size = -1;
    plan.reasons.push_back(fmt::format("{}: auto -> -1 ({})", path, why));
  };
  const auto& hpz = fixed.zero.hpz_partition_size;
  if (world.nodes < 2 || per_node < 2 || (hpz && *hpz > 1)) {
    plan.config.zero.mics_shard_size = -1;
    choice = choose(spec, fixed, plan.config, world, shape, budget);
    if (world.nodes < 2) return everywhere("one node: sharding across every rank stays on it");
    if (per_node < 2) return everywhere("one rank per node: a group per node would shard nothing");
    return everywhere(
        fmt::format("zero_hpz_partition_size {} keeps backward's gathers on the node", *hpz));
  }
  plan.config.zero.mics_shard_size = -1;
  Choice flat = choose(spec, fixed, plan.config, world, shape, budget);
  plan.config.zero.mics_shard_size = per_node;
  Choice grouped = choose(spec, fixed, plan.config, world, shape, budget);
  const int best_flat = best_of(flat);
  const int best_grouped = best_of(grouped);
  if (flat.options[best_flat].option.stage == 0) {
    choice = std::move(flat);
    return everywhere("stage 0 shards nothing");
  }
  if (grouped.chosen < 0 || (flat.chosen >= 0 && best_grouped != best_flat)) {
    choice = std::move(flat);
    return everywhere(fmt::format("sharding inside each node of {} ranks would need {}", per_node,
                                  grouped.options[best_grouped].option.label()));
  }
  choice = std::move(grouped);
  plan.reasons.push_back(fmt::format(
      "{}: auto -> {} (one shard group per node: gathers and reduce-scatters stay on the node, "
      "each gradient shard crosses nodes once, in an all-reduce; states take {}x the memory of "
      "sharding across all {} ranks)",
      path, per_node, world.nodes, world.data_parallel_ranks()));
}

// zero_hpz_partition_size auto: a secondary copy per node where stage 3 runs on more than
// one node without shard groups, and the copy costs no offload the plan without it avoids.
void resolve_hpz(const ModelSpec& spec, const Config& fixed, const WorldShape& world,
                 const TrainingShape& shape, const HardwareBudget& budget, Plan& plan,
                 Choice& choice) {
  const char* path = "zero_optimization.zero_hpz_partition_size";
  const int64_t per_node = world.data_parallel_per_node();
  auto none = [&](const std::string& why) {
    plan.config.zero.hpz_partition_size = 1;
    plan.reasons.push_back(fmt::format("{}: auto -> 1 ({})", path, why));
  };
  const PlanOption& best = choice.options[best_of(choice)].option;
  if (best.stage != 3) return none(fmt::format("stage {} gathers no parameters", best.stage));
  if (*plan.config.zero.mics_shard_size > 0)
    return none("mics_shard_size keeps every gather on the node already");
  if (world.nodes < 2) return none("one node: backward's gathers stay on it");
  if (per_node < 2) return none("one rank per node: a copy sharded per node is the shard itself");
  if (best.params != OD::None)
    return none("parameters are offloaded; the copy would keep them in device memory");
  if (choice.chosen < 0) return none("nothing fits without it");
  plan.config.zero.hpz_partition_size = per_node;
  Choice with_copy = choose(spec, fixed, plan.config, world, shape, budget);
  if (with_copy.chosen != choice.chosen) {
    return none(fmt::format("the secondary copy would need {}",
                            with_copy.options[best_of(with_copy)].option.label()));
  }
  const int64_t copy =
      with_copy.options[with_copy.chosen].bytes.at(Tier::Device, Kind::SecondaryParams);
  choice = std::move(with_copy);
  plan.reasons.push_back(
      fmt::format("{}: auto -> {} (ZeRO++ hpZ: after forward's gathers each rank keeps 1/{} of the "
                  "parameters, {} GiB, so backward's gathers stay on the node)",
                  path, per_node, per_node, format_gib(static_cast<double>(copy))));
}

// overlap_step auto, once stage and offload are chosen: on where the step inside backward
// is exact and the model is on a GPU (on the CPU, backward already uses every core).
void resolve_overlap_step(Plan& plan, const TrainingShape& shape) {
  std::string& value = plan.config.zero.offload_optimizer.overlap_step;
  if (value != "auto") return;
  const auto obstacle = overlap_step_obstacle(plan.config);
  std::string why = obstacle ? obstacle->why : "";
  if (why.empty() && shape.device_is_host) {
    why = "the model is on the CPU, whose cores backward uses; true overlaps anyway";
  }
  value = why.empty() ? "true" : "false";
  if (plan.option.optimizer == OD::None) return;  // nothing to say: nothing is offloaded
  plan.reasons.push_back(fmt::format(
      "zero_optimization.offload_optimizer.overlap_step: auto -> {} ({})", value,
      why.empty() ? "each gradient shard steps on the host while backward goes on" : why));
}

// activation_checkpointing.mode auto: what the chosen option recomputes at this batch.
std::string auto_policy_reason(const ModelSpec& spec, const TrainingShape& shape,
                               const OptionEstimate& chosen) {
  const char* key = "activation_checkpointing.mode: auto";
  const char* again = "the engine decides again for each batch a forward brings";
  if (!spec.has_shape() || !chosen.recomputed)
    return fmt::format(
        "{}, decided at each forward from its batch (no model shape to count "
        "activations from here)",
        key);
  const int64_t k = *chosen.recomputed;
  const std::string why = k == 0 ? "the activations fit beside the rest"
                          : !chosen.fits && k == spec.layers
                              ? "the most there is; even so nothing fits"
                              : fmt::format("the fewest with which {} fits", chosen.option.label());
  return fmt::format(
      "{} -> {} of {} blocks recomputed whole for micro-batches of {} x {} tokens ({}); {}", key, k,
      spec.layers, shape.micro_batch, shape.seq, why, again);
}

// Nothing fits with every optimizer shard on the host (offload_optimizer.ratio 1,
// DeepSpeed's default): say whether part of it on the device would.
std::string ratio_hint(const ModelSpec& spec, const Config& fixed, const Config& resolved,
                       const WorldShape& world, const TrainingShape& shape,
                       const HardwareBudget& budget) {
  const auto& ratio = fixed.zero.offload_optimizer.ratio;
  if (!ratio || *ratio < 1) return "";
  Config open = fixed;
  open.zero.offload_optimizer.ratio.reset();
  Config trial = resolved;
  trial.zero.offload_optimizer.ratio.reset();
  trial.zero.offload_optimizer.overlap_step = fixed.zero.offload_optimizer.overlap_step;
  const Choice c = choose(spec, open, trial, world, shape, budget);
  if (c.chosen < 0) return "";
  const OptionEstimate& e = c.options[c.chosen];
  return fmt::format(
      "; with zero_optimization.offload_optimizer.ratio auto (part of the optimizer on the "
      "device) {} fits, at ratio {:.6g}",
      e.option.label(), e.ratio.value_or(1.0));
}

}  // namespace

Recomputed fewest_recomputed(const ModelSpec& spec, const PlanOption& option, const Config& config,
                             const WorldShape& world, const TrainingShape& shape,
                             const HardwareBudget& budget) {
  TrainingShape t = shape;
  const auto fits = [&](int64_t whole) {
    t.recomputed = {whole, 0};
    OptionEstimate e;
    e.bytes = predict_memory(spec, option, config, world, t);
    judge(e, world, budget);
    return e.fits;
  };
  const int64_t layers = spec.layers;
  if (!spec.has_shape() || shape.activation_checkpointing || fits(0)) return {};
  // From one block on, each more recomputed keeps less (one block's activations come back
  // while it is recomputed, so one block may keep more than none): the fewest, by halving.
  int64_t low = 1, high = layers;
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (fits(mid)) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return {high, 0};
}

const std::vector<PlanOption>& plan_options() {
  static const std::vector<PlanOption> options{
      {0, OD::None, OD::None}, {1, OD::None, OD::None}, {2, OD::None, OD::None},
      {3, OD::None, OD::None}, {1, OD::Cpu, OD::None},  {2, OD::Cpu, OD::None},
      {3, OD::Cpu, OD::None},  {1, OD::Nvme, OD::None}, {2, OD::Nvme, OD::None},
      {3, OD::Nvme, OD::None}, {3, OD::Cpu, OD::Cpu},   {3, OD::Nvme, OD::Cpu},
      {3, OD::Cpu, OD::Nvme},  {3, OD::Nvme, OD::Nvme},
  };
  return options;
}

Config Plan::running() const {
  // The settings are what the engine runs: a value it changed after planning (a pipeline
  // stage keeping every unit gathered) is read from them, never from a second copy.
  Config c = config;
  c.zero.stage3_param_persistence_threshold = settings.stage3_param_persistence_threshold;
  return c;
}

MemoryBreakdown Plan::predict(const ModelSpec& spec, const WorldShape& world,
                              const TrainingShape& shape) const {
  return predict_memory(spec, option, running(), world, shape);
}

Recomputed Plan::recomputed_for(const ModelSpec& spec, const WorldShape& world,
                                const TrainingShape& shape, const HardwareBudget& budget) const {
  return fewest_recomputed(spec, option, running(), world, shape, budget);
}

Plan make_plan(const ModelSpec& spec, const Config& config, const WorldShape& world,
               const TrainingShape& given_shape, const HardwareBudget& budget) {
  if (world.nodes < 1 || world.ranks_per_node < 1) fail("nodes and ranks per node must be >= 1");
  if (world.tensor_parallel < 1 || world.ranks_per_node % world.tensor_parallel != 0) {
    fail(
        "tensor-parallel size {} does not divide the {} ranks per node; allowed: a divisor "
        "(tensor-parallel ranks exchange activations every layer: they share a node)",
        world.tensor_parallel, world.ranks_per_node);
  }
  // Activations are one rank's slice of each sequence (Ulysses, sequence_parallel_size).
  TrainingShape shape = given_shape;
  shape.sequence_parallel = std::max<int64_t>(1, config.sequence_parallel_size.value_or(1));
  shape.ring_attention = config.ring_attention;
  check_mics_world(config, world);
  check_hpz_world(config, world);
  Plan plan;
  plan.config = resolve_auto_knobs(config, spec, world, plan.reasons);
  // Judged without groups or a secondary copy first; where they are auto, resolve_mics
  // and resolve_hpz judge them again with.
  const auto& z = config.zero;
  if (!z.mics_shard_size) plan.config.zero.mics_shard_size = -1;
  if (!z.hpz_partition_size) plan.config.zero.hpz_partition_size = 1;
  Choice choice = choose(spec, config, plan.config, world, shape, budget);
  if (!z.mics_shard_size) resolve_mics(spec, config, world, shape, budget, plan, choice);
  if (!z.hpz_partition_size) resolve_hpz(spec, config, world, shape, budget, plan, choice);
  plan.options = std::move(choice.options);
  const OptionEstimate* chosen = choice.chosen < 0 ? nullptr : &plan.options[choice.chosen];
  const OptionEstimate* closest = &plan.options[choice.closest];
  plan.fits = chosen != nullptr;
  apply_choice(plan, chosen ? *chosen : *closest);
  resolve_overlap_step(plan, shape);
  if (config.activation_checkpointing_mode == "auto" && !shape.inference)
    plan.reasons.push_back(auto_policy_reason(spec, shape, chosen ? *chosen : *closest));
  if (chosen && chosen->recomputed && on_device(chosen->option) && spec.has_shape()) {
    plan.summary = fmt::format(
        "recommended: {}: of the choices without offload, the one recomputing the fewest "
        "blocks ({} of {}; activation_checkpointing.mode auto), the earliest where they tie",
        chosen->option.label(), *chosen->recomputed, spec.layers);
  } else if (chosen) {
    plan.summary = fmt::format(
        "recommended: {}: the first choice that fits in the order no "
        "offload, optimizer cpu, optimizer nvme, params cpu, params nvme",
        chosen->option.label());
  } else {
    plan.summary = fmt::format("nothing fits: the closest, {}, has {}", closest->option.label(),
                               closest->verdict);
    plan.summary += activation_hint(spec, plan.config, closest->bytes, shape);
    plan.summary += ratio_hint(spec, config, plan.config, world, shape, budget);
  }
  plan.reasons.insert(plan.reasons.begin(), plan.summary);
  plan.settings = settings_of(plan.config);
  return plan;
}

}  // namespace zeroshard
