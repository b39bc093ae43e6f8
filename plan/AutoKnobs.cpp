// resolve_auto_knobs: the config's `auto` keys that do not depend on the stage/offload
// choice, each with the reason the plan prints.
#include "plan/AutoKnobs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

template <typename T>
void fill(std::optional<T>& knob, T value, const char* path, const char* why,
          std::vector<std::string>& reasons) {
  if (knob) return;
  knob = value;
  reasons.push_back(fmt::format("{}: auto -> {} ({})", path, value, why));
}

std::string batch_key_text(const std::optional<int64_t>& v) {
  return v ? std::to_string(*v) : std::string("left out");
}

}  // namespace

// DeepSpeed's rule (its config's _set_batch_related_parameters): of train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps, the ones left out (or
// auto) follow from the others over the data-parallel ranks; train_batch_size alone means
// no accumulation, the micro-batch alone too. Where DeepSpeed stops (neither of the first
// two given), the micro-batch is 1. The ranks of a sequence-parallel group share their
// samples: they count once.
void resolve_batch(Config& c, const WorldShape& world, std::vector<std::string>& reasons) {
  const int64_t sp = c.sequence_parallel_size.value_or(1);
  if (sp < 1 || world.data_parallel_ranks() % sp != 0) {
    fail(
        "config key 'sequence_parallel_size' is {}, but {} data-parallel ranks do not split "
        "into groups of {}; allowed: a divisor of {}",
        sp, world.data_parallel_ranks(), sp, world.data_parallel_ranks());
  }
  const int64_t ranks = world.data_parallel_ranks() / sp;
  auto& total = c.train_batch_size;
  auto& micro = c.train_micro_batch_size_per_gpu;
  auto& accumulation = c.gradient_accumulation_steps;
  const std::string given = fmt::format(
      "train_batch_size ({}), train_micro_batch_size_per_gpu ({}) and "
      "gradient_accumulation_steps ({})",
      batch_key_text(total), batch_key_text(micro), batch_key_text(accumulation));
  auto refuse = [&] {
    const std::string product = micro && accumulation
                                    ? fmt::format(" ({} x {} x {} = {})", *micro, *accumulation,
                                                  ranks, *micro * *accumulation * ranks)
                                    : "";
    fail(
        "config keys {} do not fit {} ranks{}; allowed: train_batch_size = "
        "train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks (the data-parallel "
        "ranks over sequence_parallel_size), with any one of them left out to be derived from "
        "the other two",
        given, ranks, product);
  };
  const char* why = "DeepSpeed's rule: from the other batch keys";
  if (total && micro && !accumulation) {
    if (*total % (*micro * ranks) != 0) refuse();
    fill<int64_t>(accumulation, *total / (*micro * ranks), "gradient_accumulation_steps", why,
                  reasons);
  } else if (total && accumulation && !micro) {
    if (*total % (*accumulation * ranks) != 0) refuse();
    fill<int64_t>(micro, *total / (*accumulation * ranks), "train_micro_batch_size_per_gpu", why,
                  reasons);
  } else if (total && !micro) {
    if (*total % ranks != 0) refuse();
    fill<int64_t>(accumulation, 1, "gradient_accumulation_steps", why, reasons);
    fill<int64_t>(micro, *total / ranks, "train_micro_batch_size_per_gpu", why, reasons);
  } else if (!total && !micro) {
    fill<int64_t>(micro, 1, "train_micro_batch_size_per_gpu",
                  "one sample per rank (DeepSpeed needs train_batch_size or "
                  "train_micro_batch_size_per_gpu); raise it while the plan still fits",
                  reasons);
  }
  fill<int64_t>(accumulation, 1, "gradient_accumulation_steps", "no accumulation", reasons);
  if (total && *total != *micro * *accumulation * ranks) refuse();
}

namespace {

void resolve_training(Config& c, std::vector<std::string>& r) {
  fill(c.gradient_clipping, 1.0, "gradient_clipping", "clip the global norm at 1.0", r);
  // DeepSpeed's default: gradients are reduced in the training precision (summed in 16 bits
  // with bf16 or fp16); communication_data_type fp32 sums them in fp32.
  if (c.communication_data_type.empty() && (c.bf16 || c.fp16.enabled)) {
    c.communication_data_type = c.bf16 ? "bf16" : "fp16";
    r.push_back(
        fmt::format("communication_data_type: unset -> {} (DeepSpeed's default: the "
                    "training precision; fp32 sums the gradients in fp32)",
                    c.communication_data_type));
  }
  fill(c.comm_timeout_seconds, 300.0, "comm_timeout_seconds", "five minutes", r);
  const char* dflt = "DeepSpeed's default";
  fill(c.fp16.loss_scale, 0.0, "fp16.loss_scale", "dynamic loss scaling", r);
  fill<int64_t>(c.fp16.initial_scale_power, 16, "fp16.initial_scale_power", dflt, r);
  fill<int64_t>(c.fp16.loss_scale_window, 1000, "fp16.loss_scale_window", dflt, r);
  fill<int64_t>(c.fp16.hysteresis, 2, "fp16.hysteresis", dflt, r);
  fill(c.fp16.min_loss_scale, 1.0, "fp16.min_loss_scale", dflt, r);
  const char* torch_default = "torch.optim.AdamW's default";
  fill(c.optimizer.lr, 1e-3, "optimizer.params.lr", torch_default, r);
  fill(c.optimizer.beta1, 0.9, "optimizer.params.betas[0]", torch_default, r);
  fill(c.optimizer.beta2, 0.999, "optimizer.params.betas[1]", torch_default, r);
  fill(c.optimizer.eps, 1e-8, "optimizer.params.eps", torch_default, r);
  fill(c.optimizer.weight_decay, 0.01, "optimizer.params.weight_decay", torch_default, r);
  auto& s = c.scheduler;
  fill(s.warmup_min_lr, std::vector<double>{0.0}, "scheduler.params.warmup_min_lr", dflt, r);
  fill(s.warmup_max_lr, std::vector<double>{*c.optimizer.lr}, "scheduler.params.warmup_max_lr",
       "optimizer lr", r);
  fill<int64_t>(s.warmup_num_steps, 1000, "scheduler.params.warmup_num_steps", dflt, r);
  fill<int64_t>(s.total_num_steps, 10000, "scheduler.params.total_num_steps", dflt, r);
}

void resolve_zero(Config& c, const ModelSpec& spec, std::vector<std::string>& r) {
  auto& z = c.zero;
  const int64_t h = spec.hidden;
  // Hugging Face's DeepSpeed integration fills these from the hidden size.
  const char* hf = "Hugging Face's rule for auto, from the hidden size";
  const char* dflt = "DeepSpeed's default";
  const bool known = h > 0;
  fill<int64_t>(z.reduce_bucket_size, known ? h * h : 500'000'000, "reduce_bucket_size",
                known ? hf : dflt, r);
  fill<int64_t>(z.allgather_bucket_size, known ? h * h : 500'000'000, "allgather_bucket_size",
                known ? hf : dflt, r);
  if (spec.all_frozen()) {
    // Served, not trained: each unit is gathered again for every forward (every generated
    // token), so two units in flight ahead of the running one overlap their reads (from
    // host RAM or NVMe) with its compute, and the device holds three units, not the model.
    fill<int64_t>(z.stage3_prefetch_bucket_size, 2 * spec.largest_unit(),
                  "stage3_prefetch_bucket_size",
                  "inference: two units ahead of the running one, each read while another runs", r);
  }
  fill<int64_t>(z.stage3_prefetch_bucket_size, known ? 9 * h * h / 10 : 50'000'000,
                "stage3_prefetch_bucket_size", known ? hf : dflt, r);
  fill<int64_t>(z.stage3_param_persistence_threshold, known ? 10 * h : 100'000,
                "stage3_param_persistence_threshold", known ? hf : dflt, r);
  fill<int64_t>(z.stage3_max_live_parameters, 1'000'000'000, "stage3_max_live_parameters", dflt, r);
  fill<int64_t>(z.sub_group_size, 100'000'000, "sub_group_size",
                "1e8: NVMe swap slots of 1.2 GB with large I/O", r);
  fill<int64_t>(z.offload_optimizer.buffer_count, 4, "offload_optimizer.buffer_count",
                "read next, step current, write previous, one spare", r);
  fill<int64_t>(z.offload_param.buffer_count, 5, "offload_param.buffer_count", dflt, r);
  fill<int64_t>(z.offload_param.max_in_cpu, 1'000'000'000, "offload_param.max_in_cpu", dflt, r);
  fill<int64_t>(c.aio.block_size, 1 << 20, "aio.block_size", dflt, r);
  fill<int64_t>(c.aio.queue_depth, 8, "aio.queue_depth", dflt, r);
  fill<int64_t>(c.aio.intra_op_parallelism, 1, "aio.intra_op_parallelism", dflt, r);
}

}  // namespace

Config resolve_auto_knobs(const Config& config, const ModelSpec& spec, const WorldShape& world,
                          std::vector<std::string>& reasons) {
  Config c = config;
  resolve_batch(c, world, reasons);
  resolve_training(c, reasons);
  resolve_zero(c, spec, reasons);
  return c;
}

}  // namespace zeroshard
