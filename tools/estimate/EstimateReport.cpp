#include "tools/estimate/EstimateReport.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/Bytes.h"
#include "plan/DeepSpeedEstimate.h"
#include "plan/PipelineStages.h"
#include "tools/estimate/EstimateExchanges.h"

namespace zeroshard::estimate {
namespace {

// --max-seq's length or --max-micro-batch's size for `option` (`largest` is in
// plan_options()' order).
Fitting largest_of(const std::vector<Fitting>& largest, const PlanOption& option) {
  const auto& options = plan_options();
  const auto where = std::find(options.begin(), options.end(), option);
  return where == options.end() ? Fitting{} : largest[where - options.begin()];
}

// activation_checkpointing.mode auto: ", N of L blocks recomputed" beside a size or verdict.
std::string recomputed_text(const EstimateInputs& in, int64_t blocks) {
  if (in.config.activation_checkpointing_mode != "auto" || in.inference) return "";
  return fmt::format(", {} of {} blocks recomputed", blocks, in.spec.layers);
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

// What recomputes blocks: the model itself, or the engine by the config's mode.
// ALST's tiled compute, where given: ", MLP in 4 tiles, logits and loss in 8 tiles".
std::string tiles_text(const TrainingShape& shape) {
  std::string out;
  if (shape.mlp_tiles > 0) out += fmt::format(", MLP in {} tiles", shape.mlp_tiles);
  if (shape.logits_tiles > 0)
    out += fmt::format(", logits and loss in {} tiles", shape.logits_tiles);
  return out;
}

std::string checkpointing_text(const EstimateInputs& in) {
  const Config& c = in.config;
  const std::string& mode = c.activation_checkpointing_mode;
  const OffloadDevice offload = c.activation_offload.device;
  const std::string offloaded =
      offload == OffloadDevice::None
          ? ""
          : fmt::format(", the blocks' activations offloaded to {}", offload_device_name(offload));
  if (in.shape.activation_checkpointing) return "on";
  if (mode == "selective")
    return "selective " + (c.selective_ac_option.empty() ? "op" : c.selective_ac_option) +
           offloaded;
  if (mode == "memory_budget")
    return fmt::format("memory_budget {}", c.activation_memory_budget.value_or(0.5));
  if (mode == "auto") return "auto (the fewest blocks recomputed that fit)" + offloaded;
  return (mode == "full" ? "full" : "off") + offloaded;
}

std::string gib(int64_t bytes) {
  return format_gib(static_cast<double>(bytes));
}

// DeepSpeed's estimator knows no tensor or expert parallelism: no column beside such a plan.
std::optional<DeepSpeedEstimate> deepspeed_for(const EstimateInputs& in, const PlanOption& o) {
  if (in.world.tensor_parallel > 1 || in.config.expert_parallel_size > 1) return std::nullopt;
  return deepspeed_estimate(o, in.spec.total_params, in.spec.largest_module_params, in.world);
}

// Served, the optimizer's place means nothing: a row is where the weights rest.
std::string option_label(const EstimateInputs& in, const PlanOption& o) {
  if (!in.inference) return o.label();
  return fmt::format("stage {}, weights {}{}", o.stage,
                     o.params == OffloadDevice::None ? "device" : offload_device_name(o.params),
                     o.kv_cache_on_host ? ", KV cache host" : "");
}

ServingStream stream_of(const EstimateInputs& in, const PlanOption& o, const Config& resolved) {
  return serving_stream(in.spec, o, resolved, in.world, in.shape, in.bandwidths);
}

std::string option_row(const EstimateInputs& in, const OptionEstimate& e, bool recommended,
                       const Config& resolved) {
  std::string extra = "-";  // DeepSpeed's estimate beside training; the stream's bound serving
  if (in.inference) {
    extra = fmt::format("{:.3g}", stream_of(in, e.option, resolved).tokens_per_second);
  } else if (const auto d = deepspeed_for(in, e.option)) {
    extra = fmt::format("{} / {}", gib(d->gpu_bytes), gib(d->cpu_bytes));
  }
  std::string verdict = e.verdict + recomputed_text(in, e.recomputed.value_or(0));
  if (!e.allowed) verdict = "(excluded by config) " + verdict;
  return fmt::format("{} {:<36} {:>9} {:>9} {:>9}  {:<17} {}\n", recommended ? "*" : " ",
                     option_label(in, e.option), gib(e.bytes.total(Tier::Device)),
                     gib(e.bytes.total(Tier::Host)), gib(e.bytes.total(Tier::Nvme)), extra,
                     verdict);
}

// Serving: the weights' tier chosen, in the order device, host RAM, NVMe.
std::string serving_summary(const EstimateInputs& in, const Plan& plan) {
  if (!plan.fits) return plan.summary;
  return fmt::format(
      "recommended: {}: the first that fits in the order weights on the device, in host RAM, on "
      "NVMe",
      option_label(in, plan.option));
}

// The decisions serving reads: stage 3's gathers and the parameters' offload, not the
// optimizer's or the gradients'.
bool serving_knob(const std::string& reason) {
  for (const char* key : {"stage3_", "zero_optimization.offload_param", "offload_param", "aio."})
    if (reason.rfind(key, 0) == 0) return true;
  return false;
}

// Serving: what each rank reads for one generated token of each sequence, and the bound.
std::string stream_lines(const EstimateInputs& in, const Plan& plan) {
  const ServingStream st = stream_of(in, plan.option, plan.config);
  const Bandwidths& b = in.bandwidths;
  std::string out = fmt::format(
      "per decoding step (one token for each of the {} sequence(s)), each rank reads:\n",
      in.shape.micro_batch);
  out += fmt::format(
      "  device memory {} GiB (every weight, for its compute, and the KV cache) at {:.3g} GB/s\n",
      gib(st.device_bytes), b.device / 1e9);
  const bool kv_host = plan.option.kv_cache_on_host;
  if (st.host_bytes > 0)
    out += fmt::format(
        "  host RAM {} GiB ({}) at {:.3g} GB/s\n", gib(st.host_bytes),
        kv_host ? "the KV cache there and back, and any shard of weights there" : "its shard",
        b.host_link / 1e9);
  if (st.nvme_bytes > 0)
    out += fmt::format(
        "  NVMe {} GiB (its shard) at {:.3g} GB/s (the node's {:.3g} GB/s shared by {} "
        "rank(s), at most the host link's)\n",
        gib(st.nvme_bytes), st.nvme_rate / 1e9, b.nvme / 1e9, in.world.ranks_per_node);
  out += fmt::format(
      "bound: {:.4g} s a step, {:.4g} tokens/s per rank ({:.4g} for {} rank(s)), "
      "{} GiB read from {} per token\n",
      st.seconds_per_step, st.tokens_per_second,
      st.tokens_per_second * static_cast<double>(in.world.data_parallel_ranks()),
      in.world.data_parallel_ranks(),
      gib((st.bound_by == "nvme"   ? st.nvme_bytes
           : st.bound_by == "host" ? st.host_bytes
                                   : st.device_bytes) /
          std::max<int64_t>(1, in.shape.micro_batch)),
      st.bound_by);
  out += "  (reads alone: compute and the gathers between ranks are not in it)\n";
  if (kv_host) {
    out += fmt::format(
        "the KV cache ({} GiB) does not fit on the device beside the rest: it stays in host "
        "RAM, and generate(..., cache_implementation=\"offloaded\") (transformers' offloaded "
        "cache; zeroshard's generate passes it on a GPU where the cache does not fit) moves "
        "each layer's to the device ahead of its turn and back after it\n",
        gib(kv_cache_bytes(in.spec, in.shape, static_cast<int>(in.config.compute_bytes()))));
  }
  return out;
}

// Serving holds no optimizer state, gradients or buckets: those rows are left out.
std::string breakdown_table(const MemoryBreakdown& m, bool serving = false) {
  std::string out = fmt::format("  {:<18} {:>9} {:>9} {:>9}\n", "kind", "device", "host", "nvme");
  for (size_t k = 0; k < kNumKinds; ++k) {
    const auto kind = static_cast<Kind>(k);
    if (serving && (kind == Kind::MasterParams || kind == Kind::OptimizerStates ||
                    kind == Kind::Grads || kind == Kind::GradsFp32 || kind == Kind::CommBuckets))
      continue;
    out +=
        fmt::format("  {:<18} {:>9} {:>9} {:>9}\n", kind_name(kind), gib(m.at(Tier::Device, kind)),
                    gib(m.at(Tier::Host, kind)), gib(m.at(Tier::Nvme, kind)));
  }
  return out;
}

nlohmann::json bytes_json(const MemoryBreakdown& m) {
  nlohmann::json tiers, kinds;
  for (size_t t = 0; t < kNumTiers; ++t) {
    const auto tier = static_cast<Tier>(t);
    tiers[tier_name(tier)] = m.total(tier);
    for (size_t k = 0; k < kNumKinds; ++k) {
      const auto kind = static_cast<Kind>(k);
      kinds[tier_name(tier)][kind_name(kind)] = m.at(tier, kind);
    }
  }
  return {{"bytes", tiers}, {"bytes_by_kind", kinds}};
}

// The training shape, then what was assumed and what loading the config warned of.
std::string training_lines(const EstimateInputs& in) {
  const char* dtype = in.config.bf16 ? "bf16" : (in.config.fp16.enabled ? "fp16" : "fp32");
  std::string out =
      in.inference
          ? fmt::format(
                "serving: batch {} sequence(s) per rank, {} tokens each in the KV cache "
                "({} GiB per rank), {}\n",
                in.shape.micro_batch, in.shape.seq,
                gib(kv_cache_bytes(in.spec, in.shape, static_cast<int>(in.config.compute_bytes()))),
                dtype)
          : "";
  const int64_t sp = in.config.sequence_parallel_size.value_or(1);
  if (!in.inference)
    out = fmt::format(
        "training: seq {}{}, micro-batch {}, {}, activation checkpointing {}{}\n", in.shape.seq,
        sp > 1 ? fmt::format(" split over {} {}", sp,
                             in.config.ring_attention ? "context-parallel ranks (ring attention)"
                                                      : "sequence-parallel ranks")
               : "",
        in.shape.micro_batch, dtype, checkpointing_text(in), tiles_text(in.shape));
  if (!in.assumptions.empty()) {
    out += fmt::format("assumed (not given): {}\n", fmt::join(in.assumptions, "; "));
  }
  for (const auto& w : in.warnings) out += fmt::format("warning: {}\n", w);
  return out;
}

// The blocks of a pipeline rank's stages: "0-3", or "0-1,4-5" for stages 0 and 2 of 4.
std::string held_blocks(const EstimateInputs& in, size_t rank) {
  std::vector<std::string> ranges;
  for (int64_t stage : in.stages[rank].held) {
    const auto [first, count] =
        stage_blocks(in.spec.layers, in.pipeline_stages * in.stages_per_rank, stage);
    ranges.push_back(fmt::format("{}-{}", first, first + count - 1));
  }
  return fmt::format("{}", fmt::join(ranges, ","));
}

}  // namespace

std::string render_table(const EstimateInputs& in, const Plan& plan, const Largest& largest) {
  const ModelSpec& s = in.spec;
  std::string out;
  out += fmt::format("model: {} ({})\n", s.model_type, s.source);
  const int64_t tp = in.world.tensor_parallel, ep = in.config.expert_parallel_size;
  out += fmt::format("parameters: {}{} (largest unit {}, largest module {})\n",
                     with_commas(s.total_params),
                     tp > 1   ? fmt::format(" per rank, its tensor-parallel slices")
                     : ep > 1 ? fmt::format(" per rank, 1/{} of the experts", ep)
                              : "",
                     with_commas(s.largest_unit()), with_commas(s.largest_module_params));
  out += fmt::format(
      "world: {} node(s) x {} rank(s){}; device {} GiB/rank, host {} GiB/node, "
      "nvme {} GiB/node; {:.0f}% of device and host kept free\n",
      in.world.nodes, in.world.ranks_per_node,
      tp > 1   ? fmt::format(" (tp {} x dp {})", tp, in.world.data_parallel_ranks())
      : ep > 1 ? fmt::format(" (ep {} x edp {})", ep, in.world.data_parallel_ranks() / ep)
               : "",
      gib(in.budget.device_bytes), gib(in.budget.host_bytes), gib(in.budget.nvme_bytes),
      in.budget.headroom * 100);
  out += training_lines(in);
  out += fmt::format("\nGiB per rank{:<26} {:>9} {:>9} {:>9}  {:<17} {}\n", "", "device", "host",
                     "nvme", in.inference ? "tokens/s bound" : "DeepSpeed gpu/cpu", "verdict");
  for (const auto& e : plan.options) {
    if (in.inference && !e.allowed) continue;  // serving is stage 3 only
    out += option_row(in, e, e.option == plan.option, plan.config);
  }
  out +=
      in.inference
          ? "  (tokens/s bound: per rank, from the reads of the weights and the KV cache; below)\n"
          : "  (DeepSpeed gpu/cpu: its model-states estimate, GiB per GPU / GiB per node; it "
            "leaves\n   out activations, buckets and, at stage 2, keeps fp16 grads whole; see "
            "docs/memory-model.md)\n";
  if (!largest.seq.empty()) {
    const int64_t sp = in.config.sequence_parallel_size.value_or(1);
    out += fmt::format(
        "\nlongest sequence (--max-seq) at micro-batch {}{}, activation "
        "checkpointing {}:\n",
        in.shape.micro_batch, sp > 1 ? fmt::format(", split over {} ranks", sp) : "",
        checkpointing_text(in));
    for (const auto& e : plan.options) {
      const Fitting tokens = largest_of(largest.seq, e.option);
      out += fmt::format("  {:<37} {}\n", option_label(in, e.option),
                         tokens.size > 0 ? with_commas(tokens.size) + " tokens" +
                                               recomputed_text(in, tokens.recomputed)
                                         : "none fits");
    }
  }
  if (!largest.micro_batch.empty()) {
    out += fmt::format(
        "\nlargest micro-batch (--max-micro-batch) at {} tokens, activation checkpointing "
        "{}:\n",
        with_commas(in.shape.seq), checkpointing_text(in));
    for (const auto& e : plan.options) {
      const Fitting batch = largest_of(largest.micro_batch, e.option);
      out += fmt::format("  {:<37} {}\n", option_label(in, e.option),
                         batch.size > 0 ? with_commas(batch.size) + " sequences" +
                                              recomputed_text(in, batch.recomputed)
                                        : "none fits");
    }
  }
  out += fmt::format("\n{}\n", in.inference ? serving_summary(in, plan) : plan.summary);
  out += fmt::format("per-rank bytes of {} (GiB):\n", option_label(in, plan.option));
  out += breakdown_table(plan.predicted, in.inference);
  if (in.inference) out += stream_lines(in, plan);
  out += exchange_lines(in, plan);
  out += "decisions:\n";
  for (size_t i = 1; i < plan.reasons.size(); ++i) {
    if (in.inference && !serving_knob(plan.reasons[i])) continue;
    out += fmt::format("  {}\n", plan.reasons[i]);
  }
  return out;
}

std::string render_json(const EstimateInputs& in, const Plan& plan, const Largest& largest) {
  nlohmann::json options = nlohmann::json::array();
  for (const auto& e : plan.options) {
    nlohmann::json row = bytes_json(e.bytes);
    const bool auto_policy = in.config.activation_checkpointing_mode == "auto" && !in.inference;
    if (auto_policy) row["recomputed_blocks"] = e.recomputed.value_or(0);
    if (!largest.seq.empty()) {
      const Fitting f = largest_of(largest.seq, e.option);
      row["max_seq"] = f.size;
      if (auto_policy) row["max_seq_recomputed_blocks"] = f.recomputed;
    }
    if (!largest.micro_batch.empty()) {
      const Fitting f = largest_of(largest.micro_batch, e.option);
      row["max_micro_batch"] = f.size;
      if (auto_policy) row["max_micro_batch_recomputed_blocks"] = f.recomputed;
    }
    row["stage"] = e.option.stage;
    row["offload_optimizer"] = offload_device_name(e.option.optimizer);
    row["offload_param"] = offload_device_name(e.option.params);
    row["fits"] = e.fits;
    row["allowed"] = e.allowed;
    row["verdict"] = e.verdict;
    row["recommended"] = e.option == plan.option;
    if (in.inference) {
      const ServingStream st = stream_of(in, e.option, plan.config);
      row["kv_cache"] = e.option.kv_cache_on_host ? "host" : "device";
      row["stream"] = {{"weights", tier_name(st.weights)},
                       {"device_bytes_per_step", st.device_bytes},
                       {"host_bytes_per_step", st.host_bytes},
                       {"nvme_bytes_per_step", st.nvme_bytes},
                       {"seconds_per_step", st.seconds_per_step},
                       {"tokens_per_second_per_rank", st.tokens_per_second},
                       {"bound_by", st.bound_by}};
    }
    row["deepspeed"] = nullptr;
    if (const auto d = deepspeed_for(in, e.option)) {
      row["deepspeed"] = {{"gpu_bytes_per_rank", d->gpu_bytes},
                          {"cpu_bytes_per_node", d->cpu_bytes}};
    }
    options.push_back(row);
  }
  nlohmann::json out;
  out["model"] = {{"source", in.spec.source}, {"model_type", in.spec.model_type}};
  out["parameters"] = in.spec.total_params;
  out["largest_unit_parameters"] = in.spec.largest_unit();
  out["largest_module_parameters"] = in.spec.largest_module_params;
  out["world"] = {{"nodes", in.world.nodes},
                  {"ranks_per_node", in.world.ranks_per_node},
                  {"tensor_parallel", in.world.tensor_parallel},
                  {"expert_parallel", in.config.expert_parallel_size},
                  {"data_parallel_ranks", in.world.data_parallel_ranks()}};
  out["budget"] = {{"device_bytes_per_rank", in.budget.device_bytes},
                   {"host_bytes_per_node", in.budget.host_bytes},
                   {"nvme_bytes_per_node", in.budget.nvme_bytes},
                   {"headroom", in.budget.headroom}};
  out["training"] = {{"seq", in.shape.seq},
                     {"micro_batch", in.shape.micro_batch},
                     {"compute_bytes", in.config.compute_bytes()},
                     {"activation_checkpointing", in.shape.activation_checkpointing},
                     {"activation_checkpointing_mode", in.config.activation_checkpointing_mode},
                     {"sequence_parallel", in.config.sequence_parallel_size.value_or(1)},
                     {"ring_attention", in.config.ring_attention}};
  if (in.inference) {
    out["inference"] = {
        {"batch", in.shape.micro_batch},
        {"seq", in.shape.seq},
        {"kv_cache_bytes",
         kv_cache_bytes(in.spec, in.shape, static_cast<int>(in.config.compute_bytes()))},
        {"bandwidths",
         {{"device", in.bandwidths.device},
          {"host_link", in.bandwidths.host_link},
          {"nvme", in.bandwidths.nvme}}}};
  }
  out["assumptions"] = in.assumptions;
  out["warnings"] = in.warnings;
  out["options"] = options;
  out["exchanges"] = exchange_json(in, plan);
  out["fits"] = plan.fits;
  out["summary"] = plan.summary;
  out["reasons"] = plan.reasons;
  return out.dump(2) + "\n";
}

size_t heaviest_stage(const std::vector<Plan>& plans) {
  // Later in the order of preference saves more memory: that choice, applied to every
  // stage, also fits the stages that fit a lighter one.
  auto rank = [](const Plan& p) {
    const auto& order = plan_options();
    return std::find(order.begin(), order.end(), p.option) - order.begin();
  };
  size_t heaviest = 0;
  for (size_t s = 1; s < plans.size(); ++s) {
    const auto mine = std::make_pair(rank(plans[s]), plans[s].predicted.total(Tier::Device));
    const auto best =
        std::make_pair(rank(plans[heaviest]), plans[heaviest].predicted.total(Tier::Device));
    if (mine > best) heaviest = s;
  }
  return heaviest;
}

std::string render_pipeline_table(const EstimateInputs& in, const std::vector<Plan>& plans) {
  const ModelSpec& s = in.spec;
  const WorldShape& w = in.world;
  std::string out = fmt::format("model: {} ({}), {} parameters\n", s.model_type, s.source,
                                with_commas(s.total_params));
  out += fmt::format(
      "pipeline: {} stages x tp {} x dp {}, each stage {} node(s) x {} rank(s); schedule {}, "
      "{} micro-batches a step{}\n",
      in.pipeline_stages, w.tensor_parallel, w.data_parallel_ranks(), w.nodes, w.ranks_per_node,
      in.schedule, in.micro_batches,
      in.stages_per_rank > 1 ? fmt::format(", {} stages on each (stage s on pp s % {})",
                                           in.stages_per_rank, in.pipeline_stages)
                             : "");
  out += training_lines(in);
  out += fmt::format("\n{:<6} {:<9} {:>14} {:>9}  {:<36} {:>9} {:>9} {:>9}  {}\n", "pp", "blocks",
                     "parameters", "in flight", "recommended ZeRO (GiB per rank)", "device", "host",
                     "nvme", "verdict");
  for (size_t stage = 0; stage < plans.size(); ++stage) {
    const Plan& p = plans[stage];
    out += fmt::format("{:<6} {:<9} {:>14} {:>9}  {:<36} {:>9} {:>9} {:>9}  {}\n", stage,
                       held_blocks(in, stage), with_commas(in.stages[stage].spec.total_params),
                       in.stages[stage].shape.in_flight, p.option.label(),
                       gib(p.predicted.total(Tier::Device)), gib(p.predicted.total(Tier::Host)),
                       gib(p.predicted.total(Tier::Nvme)), p.fits ? "fits" : p.summary);
  }
  const size_t heaviest = heaviest_stage(plans);
  out +=
      fmt::format("\nper-rank bytes of pipeline stage {} (the most device bytes), ZeRO {} (GiB):\n",
                  heaviest, plans[heaviest].option.label());
  out += breakdown_table(plans[heaviest].predicted);
  return out;
}

std::string render_pipeline_json(const EstimateInputs& in, const std::vector<Plan>& plans) {
  nlohmann::json stages = nlohmann::json::array();
  bool fits = true;
  for (size_t stage = 0; stage < plans.size(); ++stage) {
    const Plan& p = plans[stage];
    const std::vector<int64_t>& held = in.stages[stage].held;
    const int64_t all = in.pipeline_stages * in.stages_per_rank;
    nlohmann::json row = bytes_json(p.predicted);
    row["stage"] = stage;
    row["first_block"] = stage_blocks(in.spec.layers, all, held.front()).first;
    row["blocks"] = in.stages[stage].spec.layers;
    if (held.size() > 1) row["pipeline_stages_held"] = held;
    row["parameters"] = in.stages[stage].spec.total_params;
    row["micro_batches_in_flight"] = in.stages[stage].shape.in_flight;
    row["zero_stage"] = p.option.stage;
    row["offload_optimizer"] = offload_device_name(p.option.optimizer);
    row["offload_param"] = offload_device_name(p.option.params);
    row["fits"] = p.fits;
    row["summary"] = p.summary;
    fits = fits && p.fits;
    stages.push_back(row);
  }
  nlohmann::json out;
  out["model"] = {{"source", in.spec.source}, {"model_type", in.spec.model_type}};
  out["parameters"] = in.spec.total_params;
  out["world"] = {{"pipeline_stages", in.pipeline_stages},
                  {"nodes_per_stage", in.world.nodes},
                  {"ranks_per_node_per_stage", in.world.ranks_per_node},
                  {"tensor_parallel", in.world.tensor_parallel},
                  {"data_parallel_ranks", in.world.data_parallel_ranks()}};
  out["schedule"] = in.schedule;
  out["stages_per_rank"] = in.stages_per_rank;
  out["micro_batches"] = in.micro_batches;
  out["assumptions"] = in.assumptions;
  out["warnings"] = in.warnings;
  out["stages"] = stages;
  out["fits"] = fits;
  return out.dump(2) + "\n";
}

}  // namespace zeroshard::estimate
