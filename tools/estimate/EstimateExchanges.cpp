#include "tools/estimate/EstimateExchanges.h"

#include <fmt/format.h>

#include "common/Bytes.h"
#include "plan/Exchanges.h"

namespace zeroshard::estimate {
namespace {

// The exchanges of a micro-step under `plan`: the blocks its choice recomputes.
Exchanges planned(const EstimateInputs& in, const Plan& plan) {
  TrainingShape shape = in.shape;
  shape.sequence_parallel = in.config.sequence_parallel_size.value_or(1);
  shape.ring_attention = in.config.ring_attention;
  for (const OptionEstimate& e : plan.options)
    if (e.option == plan.option && e.recomputed) shape.recomputed.whole = *e.recomputed;
  shape.recomputed = recomputed_layers(in.spec, plan.config, shape);
  return exchanges_of(in.spec, shape, in.config.expert_parallel_size,
                      static_cast<int>(in.config.compute_bytes()));
}

std::string line(const char* what, const char* layers, const LayerExchange& x,
                 const std::string& crossing) {
  return fmt::format(
      "  {} ({} ranks): {} {} layers, each {} GiB forward and {} GiB backward, {} forwards in "
      "all: {} GiB in; {}\n",
      what, x.ranks, x.layers, layers, format_gib(static_cast<double>(x.forward_bytes)),
      format_gib(static_cast<double>(x.backward_bytes)), x.forward_passes,
      format_gib(static_cast<double>(x.micro_step_bytes())), crossing);
}

std::string to_others(const LayerExchange& x, const char* where = "") {
  return fmt::format("{}/{} of it to other ranks{}", x.ranks - 1, x.ranks, where);
}

nlohmann::json to_json(const LayerExchange& x) {
  return {{"ranks", x.ranks},
          {"layers", x.layers},
          {"forward_bytes_per_layer", x.forward_bytes},
          {"backward_bytes_per_layer", x.backward_bytes},
          {"forward_passes", x.forward_passes},
          {"bytes_per_micro_step", x.micro_step_bytes()}};
}

}  // namespace

std::string exchange_lines(const EstimateInputs& in, const Plan& plan) {
  if (in.inference) return "";
  const Exchanges x = planned(in, plan);
  if (x.experts.layers == 0 && x.sequence.layers == 0 && x.ring.layers == 0) return "";
  std::string out =
      "exchanges per micro-step, each rank's input (forward, backward, and the forward "
      "again of each recomputed block):\n";
  if (x.experts.layers > 0)
    out += line("experts", "MoE", x.experts,
                to_others(x.experts,
                          " where routes spread evenly (a rank's mean: each "
                          "returns the rows it was sent)"));
  if (x.sequence.layers > 0)
    out += line("sequence", "attention", x.sequence, to_others(x.sequence));
  if (x.ring.layers > 0)
    out += line("ring", "attention", x.ring,
                "keys and values all-gathered (torch's default rotation), their fp32 "
                "gradients passed to the next rank once a rank");
  return out;
}

nlohmann::json exchange_json(const EstimateInputs& in, const Plan& plan) {
  if (in.inference) return nullptr;
  const Exchanges x = planned(in, plan);
  if (x.experts.layers == 0 && x.sequence.layers == 0 && x.ring.layers == 0) return nullptr;
  nlohmann::json out;
  if (x.experts.layers > 0) out["experts"] = to_json(x.experts);
  if (x.sequence.layers > 0) out["sequence"] = to_json(x.sequence);
  if (x.ring.layers > 0) out["ring"] = to_json(x.ring);
  return out;
}

}  // namespace zeroshard::estimate
