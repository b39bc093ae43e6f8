#include "tools/estimate/EstimateArgs.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/Bytes.h"
#include "common/DidYouMean.h"
#include "common/Error.h"
#include "plan/HfConfig.h"
#include "plan/PipelineStages.h"

namespace zeroshard::estimate {
namespace {

const std::vector<std::string> kValueFlags{
    "--hf-config",   "--params",        "--layers",       "--hidden",      "--heads",
    "--kv-heads",    "--vocab",         "--intermediate", "--nodes",       "--gpus-per-node",
    "--tp",          "--gpu-mem",       "--cpu-mem",      "--nvme",        "--seq",
    "--micro-batch", "--config",        "--headroom",     "--emit-config", "--attn-implementation",
    "--pp",          "--pp-schedule",   "--batch",        "--gpu-bw",      "--pp-stages-per-rank",
    "--host-bw",     "--nvme-bw",       "--sp",           "--ep",          "--ac-mode",
    "--ac-option",   "--memory-budget", "--ac-offload",   "--cp",          "--tiled-mlp",
    "--tiled-logits"};
const std::vector<std::string> kSwitches{"--json",      "--bf16",
                                         "--fp16",      "--fp32",
                                         "--inference", "--activation-checkpointing",
                                         "--help",      "-h",
                                         "--max-seq",   "--max-micro-batch"};
const std::vector<std::string> kServingFlags{"--batch", "--gpu-bw", "--host-bw", "--nvme-bw"};

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

std::map<std::string, std::string> split_args(const std::vector<std::string>& args) {
  std::map<std::string, std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    const auto eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    const bool takes_value =
        std::find(kValueFlags.begin(), kValueFlags.end(), flag) != kValueFlags.end();
    const bool is_switch = std::find(kSwitches.begin(), kSwitches.end(), flag) != kSwitches.end();
    if (!takes_value && !is_switch) {
      std::vector<std::string> all = kValueFlags;
      all.insert(all.end(), kSwitches.begin(), kSwitches.end());
      const std::string guess = closest_match(flag, all);
      fail("unknown option '{}'{}; see --help", flag,
           guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess));
    }
    if (takes_value && eq == std::string::npos) {
      if (i + 1 >= args.size()) fail("{} needs a value; see --help", flag);
      value = args[++i];
    }
    given[flag] = value;
  }
  return given;
}

ModelSpec read_model(const std::map<std::string, std::string>& given, int64_t tp, int64_t pp = 1,
                     const std::vector<int64_t>& held = {0}, int64_t ep = 1) {
  auto count = [&](const char* flag) {
    const auto it = given.find(flag);
    return it == given.end() ? int64_t{0} : parse_count(flag, it->second);
  };
  if (given.count("--hf-config")) {
    if (given.count("--params")) fail("give either --hf-config or --params, not both");
    return spec_from_hf_file(given.at("--hf-config"), tp, pp, held, ep);
  }
  ExplicitModel m;
  m.params = count("--params");
  m.layers = count("--layers");
  m.hidden = count("--hidden");
  m.heads = count("--heads");
  m.kv_heads = count("--kv-heads");
  m.vocab = count("--vocab");
  m.intermediate = count("--intermediate");
  m.tensor_parallel = tp;
  m.pipeline_stages = pp;
  m.pipeline_held = held;
  return spec_from_numbers(m);
}

void read_precision(const std::map<std::string, std::string>& given, bool have_config,
                    EstimateInputs& in) {
  const int chosen =
      static_cast<int>(given.count("--bf16") + given.count("--fp16") + given.count("--fp32"));
  if (chosen > 1) fail("give one of --bf16, --fp16, --fp32");
  if (chosen == 1) {
    in.config.bf16 = given.count("--bf16") > 0;
    in.config.fp16.enabled = given.count("--fp16") > 0;
  } else if (!have_config) {
    in.config.bf16 = true;
    in.assumptions.push_back("precision bf16 (give --fp16 or --fp32 to change)");
  }
}

// --pp: each stage's model and activations, and the world and budget of one stage.
void read_pipeline(const std::map<std::string, std::string>& given, EstimateInputs& in) {
  const int64_t configured = in.config.pipeline_parallel_size.value_or(1);
  int64_t pp = configured;
  if (given.count("--pp")) pp = parse_count("--pp", given.at("--pp"));
  if (configured > 1 && pp != configured) {
    fail("--pp {} contradicts the config's pipeline.stages {}; give one of them", pp, configured);
  }
  for (const char* flag : {"--pp-schedule", "--pp-stages-per-rank"})
    if (given.count(flag) && pp == 1) fail("{} needs --pp 2 or more", flag);
  if (pp == 1) return;
  if (given.count("--params")) {
    fail(
        "--params with {} pipeline stages: which stage holds the parameters outside the "
        "blocks is not known from a total; allowed: the shape alone (--layers, --hidden, "
        "--heads, --vocab, --intermediate), or --hf-config",
        pp);
  }
  in.pipeline_stages = pp;
  in.config.pipeline_parallel_size = pp;
  in.schedule = given.count("--pp-schedule") ? given.at("--pp-schedule") : "1f1b";
  const bool several = runs_several_stages(in.schedule);
  in.stages_per_rank = several ? 2 : 1;  // torchtitan's default for these schedules
  if (several && !given.count("--pp-stages-per-rank"))
    in.assumptions.push_back("2 stages on each rank (give --pp-stages-per-rank)");
  if (given.count("--pp-stages-per-rank")) {
    in.stages_per_rank = parse_count("--pp-stages-per-rank", given.at("--pp-stages-per-rank"));
    if (!several && in.stages_per_rank != 1) {
      fail(
          "--pp-stages-per-rank {} with --pp-schedule {}; allowed: 1, or a schedule that runs "
          "several stages on each rank (interleaved1f1b, loopedbfs)",
          in.stages_per_rank, in.schedule);
    }
  }
  WorldShape& w = in.world;
  if (w.nodes % pp == 0) {
    w.nodes /= pp;  // whole nodes per stage
  } else if (w.ranks_per_node % pp == 0 && (w.ranks_per_node / pp) % w.tensor_parallel == 0) {
    w.ranks_per_node /= pp;  // the stages share each node's host memory and NVMe
    in.budget.host_bytes /= pp;
    in.budget.nvme_bytes /= pp;
  } else {
    fail(
        "--pp {} divides neither --nodes {} nor --gpus-per-node {} (with --tp {} inside a "
        "stage); allowed: a divisor of one of them",
        pp, w.nodes, w.ranks_per_node, w.tensor_parallel);
  }
  const std::optional<int64_t>& accumulation = in.config.gradient_accumulation_steps;
  in.micro_batches = accumulation ? *accumulation : pp;
  if (!accumulation) {
    in.assumptions.push_back(
        fmt::format("{} micro-batches a step, one per stage (set gradient_accumulation_steps "
                    "in --config for more)",
                    pp));
  }
  const int64_t per_rank = in.stages_per_rank, all = pp * per_rank;
  if (in.spec.layers > 0 && (per_rank > in.spec.layers || all > in.spec.layers)) {
    fail(
        "--pp {} x --pp-stages-per-rank {} is {} stages for the model's {} blocks; allowed: at "
        "most {} stages (each holds a block)",
        pp, per_rank, pp * per_rank, in.spec.layers, in.spec.layers);
  }
  for (int64_t stage = 0; stage < pp; ++stage) {
    StageInputs s;
    s.held = stages_of_rank(pp, per_rank, stage);
    s.spec = read_model(given, in.world.tensor_parallel, all, s.held);
    s.spec.attention_scores = in.spec.attention_scores;
    s.shape = in.shape;
    s.shape.pipeline_micro_batches = in.micro_batches;
    if (!several) {
      s.shape.in_flight =
          micro_batches_in_flight(in.schedule, pp, stage, in.micro_batches, "--pp-schedule");
    } else {
      s.shape.part_steps =
          parts_in_flight(in.schedule, pp, per_rank, stage, in.micro_batches, "--pp-schedule");
      s.shape.in_flight = most_in_flight(s.shape.part_steps);
      for (int64_t held : s.held) {
        s.shape.part_layers.push_back(stage_blocks(in.spec.layers, all, held).second);
        if (held == all - 1)
          s.shape.head_part = static_cast<int64_t>(s.shape.part_layers.size()) - 1;
      }
    }
    in.stages.push_back(std::move(s));
  }
}

// --ac-mode, --ac-option, --memory-budget, --ac-offload: the config's
// activation_checkpointing keys (mode, selective_ac_option, memory_budget, offload.device).
void read_activation_policy(const std::map<std::string, std::string>& given, EstimateInputs& in) {
  Config& c = in.config;
  const auto it = given.find("--ac-mode");
  if (it != given.end()) {
    const std::vector<std::string> modes{"none", "full", "selective", "memory_budget", "auto"};
    if (std::find(modes.begin(), modes.end(), it->second) == modes.end())
      fail("--ac-mode: '{}' is not allowed; allowed: {}", it->second, fmt::join(modes, ", "));
    if (given.count("--activation-checkpointing") && it->second != "none")
      fail("--activation-checkpointing and --ac-mode {}: allowed: one of the two", it->second);
    c.activation_checkpointing_mode = it->second;
  }
  if (given.count("--ac-option")) c.selective_ac_option = given.at("--ac-option");
  if (given.count("--memory-budget")) {
    const std::string& text = given.at("--memory-budget");
    char* end = nullptr;
    const double f = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(f >= 0 && f <= 1))
      fail("--memory-budget: '{}' is not allowed; allowed: a fraction in [0, 1]", text);
    c.activation_memory_budget = f;
  }
  if (given.count("--ac-offload")) {
    const std::string& device = given.at("--ac-offload");
    if (device != "cpu" && device != "nvme" && device != "none")
      fail("--ac-offload: '{}' is not allowed; allowed: cpu, nvme or none", device);
    c.activation_offload.device = device == "cpu"    ? OffloadDevice::Cpu
                                  : device == "nvme" ? OffloadDevice::Nvme
                                                     : OffloadDevice::None;
    // The Planner's placeholder, as for the model states' NVMe (said in its reasons).
    if (device == "nvme" && c.activation_offload.nvme_path.empty())
      c.activation_offload.nvme_path = "/local_nvme";
  }
  check_contradictions(c);
}

// --inference: the model served (every unit frozen) at stage 3, batch sequences per rank
// whose KV cache holds --seq tokens, and each tier's bandwidth for the stream's bound.
void read_serving(const std::map<std::string, std::string>& given, EstimateInputs& in) {
  in.inference = given.count("--inference") > 0;
  if (!in.inference) {
    for (const auto& flag : kServingFlags)
      if (given.count(flag)) fail("{} is a serving figure; give it with --inference", flag);
    return;
  }
  if (given.count("--micro-batch"))
    fail("--micro-batch is for training; with --inference give --batch (sequences per rank)");
  for (const char* flag : {"--activation-checkpointing", "--pp", "--ac-mode", "--ac-offload"}) {
    if (given.count(flag))
      fail("{} is for training; --inference plans one stage-3 model without backward", flag);
  }
  if (in.config.pipeline_parallel_size.value_or(1) > 1) {
    fail(
        "--inference with the config's pipeline.stages {}; allowed: 1 (serving plans one "
        "stage-3 model)",
        *in.config.pipeline_parallel_size);
  }
  const int stage = in.config.zero.stage.value_or(3);
  if (stage != 3) {
    fail(
        "--inference with the config's zero_optimization.stage {}; allowed: 3 (weights "
        "sharded and gathered unit by unit, as zeroshard.init_inference serves them)",
        stage);
  }
  in.config.zero.stage = 3;
  in.spec.unit_frozen.assign(in.spec.unit_params.size(), true);
  in.shape.inference = true;
  auto rate = [&](const char* flag, double fallback, const char* note) {
    const auto it = given.find(flag);
    if (it != given.end()) return static_cast<double>(parse_bytes(it->second, flag));
    in.assumptions.push_back(note);
    return fallback;
  };
  Bandwidths& b = in.bandwidths;
  b.device = rate("--gpu-bw", b.device, "device memory 3.35TB/s (an H100 SXM; give --gpu-bw)");
  b.host_link =
      rate("--host-bw", b.host_link, "host to device 25GB/s (PCIe 4.0 x16; give --host-bw)");
  b.nvme = rate("--nvme-bw", b.nvme, "NVMe 6GB/s a node (one PCIe 4.0 drive; give --nvme-bw)");
}

// --ep (or the config's expert_parallel.autoep_size where AutoEP is enabled): a mixture of
// experts' experts split over ranks, each block's share a unit of its own, sharded over
// the ranks holding the same experts, as the engine's groups of experts are.
void read_expert_parallel(const std::map<std::string, std::string>& given, EstimateInputs& in) {
  const Config::AutoEp& autoep = in.config.autoep;
  const int64_t configured = autoep.enabled ? autoep.autoep_size.value_or(1) : 1;
  const int64_t ep = given.count("--ep") ? parse_count("--ep", given.at("--ep")) : configured;
  if (configured > 1 && ep != configured)
    fail("--ep {} contradicts the config's expert_parallel.autoep_size {}; give one of them", ep,
         configured);
  if (ep == 1) return;
  if (!given.count("--hf-config"))
    fail("--ep {} needs the model's experts: give --hf-config (a mixture of experts' config.json)",
         ep);
  if (in.world.tensor_parallel > 1 || in.pipeline_stages > 1 ||
      in.config.sequence_parallel_size.value_or(1) > 1 || in.inference)
    fail(
        "--ep {} with --tp {}, --pp {}, --sp {}{}; allowed: expert parallelism alone with ZeRO "
        "in training (--tp 1, --pp 1, --sp 1), or --ep 1",
        ep, in.world.tensor_parallel, in.pipeline_stages,
        in.config.sequence_parallel_size.value_or(1), in.inference ? " and --inference" : "");
  const int64_t ranks = in.world.data_parallel_ranks();
  if (ranks % ep != 0)
    fail("--ep {} does not divide the {} ranks (--nodes x --gpus-per-node); allowed: a divisor", ep,
         ranks);
  in.config.expert_parallel_size = ep;
  const bool scores = in.spec.attention_scores;
  in.spec = read_model(given, 1, 1, {0}, ep);
  in.spec.attention_scores = scores;
}

}  // namespace

int64_t parse_count(const std::string& flag, const std::string& text, bool allow_zero) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v != std::floor(v) ||
      v < (allow_zero ? 0 : 1) || v > 1e15) {
    fail("{}: '{}' is not allowed; allowed: a {} integer (7e9 is fine)", flag, text,
         allow_zero ? "non-negative" : "positive");
  }
  return static_cast<int64_t>(v);
}

EstimateInputs parse_args(const std::vector<std::string>& args, bool& help) {
  const auto given = split_args(args);
  help = given.count("--help") || given.count("-h");
  EstimateInputs in;
  if (help) return in;
  auto count = [&](const char* flag, int64_t fallback, const std::string& note) {
    const auto it = given.find(flag);
    if (it != given.end()) return parse_count(flag, it->second);
    if (!note.empty()) in.assumptions.push_back(note);
    return fallback;
  };
  const bool have_config = given.count("--config") > 0;
  if (have_config) {
    LoadedConfig loaded = load_config_file(given.at("--config"));
    in.config = loaded.config;
    in.warnings = loaded.warnings;
  }
  const int64_t configured_tp = in.config.tensor_parallel_size.value_or(1);
  in.world.tensor_parallel = count("--tp", configured_tp, "");
  if (configured_tp > 1 && in.world.tensor_parallel != configured_tp) {
    fail("--tp {} contradicts the config's tensor_parallel.autotp_size {}; give one of them",
         in.world.tensor_parallel, configured_tp);
  }
  if (in.world.tensor_parallel > 1) in.config.tensor_parallel_size = in.world.tensor_parallel;
  in.spec = read_model(given, in.world.tensor_parallel);
  if (!have_config) {
    in.config.zero.stage.reset();  // every stage and offload is open to the planner
    in.config.zero.offload_optimizer.device = OffloadDevice::Auto;
    in.config.zero.offload_param.device = OffloadDevice::Auto;
    for (auto* knob :
         {&in.config.zero.reduce_bucket_size, &in.config.zero.allgather_bucket_size,
          &in.config.zero.stage3_prefetch_bucket_size,
          &in.config.zero.stage3_param_persistence_threshold, &in.config.zero.sub_group_size}) {
      knob->reset();  // sized by the planner from the model
    }
    in.config.zero.mics_shard_size.reset();  // from --nodes and --gpus-per-node
    in.config.zero.hpz_partition_size.reset();
  }
  read_precision(given, have_config, in);
  in.world.nodes = count("--nodes", 1, "1 node");
  in.world.ranks_per_node = count("--gpus-per-node", 1, "1 rank per node");
  read_serving(given, in);
  const int64_t config_micro = in.config.train_micro_batch_size_per_gpu.value_or(1);
  in.shape.micro_batch =
      in.inference ? count("--batch", 1, "batch 1 sequence per rank")
                   : count("--micro-batch", config_micro,
                           fmt::format("micro-batch {} (from the config or 1)", config_micro));
  in.config.train_micro_batch_size_per_gpu = in.shape.micro_batch;
  const int64_t seq = in.spec.max_positions > 0 ? in.spec.max_positions : 1;
  in.shape.seq = count("--seq", seq, fmt::format("sequence length {}", seq));
  in.shape.activation_checkpointing =
      given.count("--activation-checkpointing") > 0 || in.config.activation_checkpointing;
  read_activation_policy(given, in);
  if (given.count("--attn-implementation")) {
    in.spec.attention_scores =
        attention_keeps_scores(given.at("--attn-implementation"), "--attn-implementation");
  } else if (in.spec.has_shape()) {
    in.assumptions.push_back(in.spec.attention_scores
                                 ? "attention eager, as the config says"
                                 : "attention sdpa, transformers' default (give "
                                   "--attn-implementation eager for scores kept in memory)");
  }
  auto size = [&](const char* flag, int64_t fallback, const char* note) -> int64_t {
    const auto it = given.find(flag);
    if (it != given.end()) return static_cast<int64_t>(parse_bytes(it->second, flag));
    in.assumptions.push_back(note);
    return fallback;
  };
  in.budget.device_bytes = size("--gpu-mem", 80'000'000'000, "80GB device memory per rank");
  in.budget.host_bytes = size("--cpu-mem", host_memory_bytes(), "host RAM of this machine");
  in.budget.nvme_bytes = size("--nvme", 0, "no NVMe (give --nvme SIZE)");
  if (given.count("--headroom")) {
    char* end = nullptr;
    const std::string& text = given.at("--headroom");
    in.budget.headroom = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(in.budget.headroom >= 0) ||
        in.budget.headroom >= 1) {
      fail("--headroom: '{}' is not allowed; allowed: a fraction in [0, 1)", text);
    }
  }
  read_pipeline(given, in);
  read_sequence_parallel(given, in);
  read_expert_parallel(given, in);
  read_tiles(given, in);
  in.max_seq = given.count("--max-seq") > 0;
  in.max_micro_batch = given.count("--max-micro-batch") > 0;
  for (const auto& [asked, flag] :
       {std::pair{in.max_seq, "--max-seq"}, std::pair{in.max_micro_batch, "--max-micro-batch"}}) {
    if (asked && (in.inference || in.pipeline_stages > 1))
      fail("{} with {}; allowed: training without pipeline stages", flag,
           in.inference ? "--inference" : fmt::format("--pp {}", in.pipeline_stages));
    if (asked && !in.spec.has_shape())
      fail(
          "{} needs the model's shape to count activations: give --hf-config, or "
          "--layers, --hidden and --heads",
          flag);
  }
  in.json = given.count("--json") > 0;
  if (given.count("--emit-config")) in.emit_config = given.at("--emit-config");
  return in;
}

}  // namespace zeroshard::estimate
