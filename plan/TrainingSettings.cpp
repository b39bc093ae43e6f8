#include "plan/TrainingSettings.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "common/Error.h"
#include "plan/MemoryModel.h"

namespace zeroshard {
namespace {

template <typename T>
T resolved(const std::optional<T>& value, const char* key) {
  if (!value) fail("internal: '{}' is still auto after planning", key);
  return *value;
}

}  // namespace

AdamHyper adam_defaults(const OptimizerConfig& o) {
  AdamHyper h;
  h.lr = resolved(o.lr, "optimizer.params.lr");
  h.beta1 = resolved(o.beta1, "optimizer.params.betas");
  h.beta2 = resolved(o.beta2, "optimizer.params.betas");
  h.eps = resolved(o.eps, "optimizer.params.eps");
  h.weight_decay = resolved(o.weight_decay, "optimizer.params.weight_decay");
  // DeepSpeed's rule: type Adam is AdamW too unless adam_w_mode is false.
  h.decoupled = o.type == "AdamW" || o.adam_w_mode;
  h.bias_correction = o.bias_correction;
  return h;
}

TrainingSettings settings_of(const Config& c) {
  const ZeroConfig& z = c.zero;
  TrainingSettings s;
  s.stage = ZeroStage(static_cast<int>(resolved(z.stage, "zero_optimization.stage")));
  s.compute = c.bf16 ? Precision::Bf16 : c.fp16.enabled ? Precision::Fp16 : Precision::Fp32;
  if (c.communication_data_type == "fp32") s.communication = Precision::Fp32;
  if (c.communication_data_type == "fp16") s.communication = Precision::Fp16;
  if (c.communication_data_type == "bf16") s.communication = Precision::Bf16;
  s.overlap_comm = z.overlap_comm;
  s.reduce_bucket_size = resolved(z.reduce_bucket_size, "zero_optimization.reduce_bucket_size");
  s.stage3_prefetch_bucket_size =
      resolved(z.stage3_prefetch_bucket_size, "zero_optimization.stage3_prefetch_bucket_size");
  s.stage3_max_live_parameters =
      resolved(z.stage3_max_live_parameters, "zero_optimization.stage3_max_live_parameters");
  s.stage3_param_persistence_threshold = resolved(
      z.stage3_param_persistence_threshold, "zero_optimization.stage3_param_persistence_threshold");
  s.sub_group_size = resolved(z.sub_group_size, "zero_optimization.sub_group_size");
  s.mics_shard_size = resolved(z.mics_shard_size, "zero_optimization.mics_shard_size");
  s.hpz_partition_size =
      resolved(z.hpz_partition_size, "zero_optimization.zero_hpz_partition_size");
  s.tensor_parallel_size = resolved(c.tensor_parallel_size, "tensor_parallel.autotp_size");
  s.pipeline_parallel_size = resolved(c.pipeline_parallel_size, "pipeline.stages");
  s.sequence_parallel_size = resolved(c.sequence_parallel_size, "sequence_parallel_size");
  s.expert_parallel_size = c.expert_parallel_size;
  s.weight_quantization = c.weight_quantization.layout();
  const std::string& overlap = z.offload_optimizer.overlap_step;
  if (overlap == "auto") {
    fail(
        "internal: 'zero_optimization.offload_optimizer.overlap_step' is still auto after "
        "planning");
  }
  s.overlap_step = overlap == "true";
  if (const auto obstacle = overlap_step_obstacle(c)) s.overlap_step_obstacle = obstacle->why;
  s.offload_optimizer = {z.offload_optimizer.device, z.offload_optimizer.nvme_path,
                         resolved(z.offload_optimizer.buffer_count,
                                  "zero_optimization.offload_optimizer.buffer_count")};
  s.offload_param = {
      z.offload_param.device, z.offload_param.nvme_path,
      resolved(z.offload_param.buffer_count, "zero_optimization.offload_param.buffer_count")};
  s.optimizer_host_ratio = split_ratio(
      PlanOption{s.stage.number(), z.offload_optimizer.device, z.offload_param.device}, c);
  s.param_max_in_cpu = z.offload_param.max_in_cpu.value_or(0);
  s.aio.block_size = resolved(c.aio.block_size, "aio.block_size");
  s.aio.queue_depth = static_cast<int>(resolved(c.aio.queue_depth, "aio.queue_depth"));
  s.aio.rings = static_cast<int>(resolved(c.aio.intra_op_parallelism, "aio.intra_op_parallelism"));
  s.gradient_accumulation_steps =
      resolved(c.gradient_accumulation_steps, "gradient_accumulation_steps");
  s.gradient_clipping = resolved(c.gradient_clipping, "gradient_clipping");
  s.comm_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(resolved(c.comm_timeout_seconds, "comm_timeout_seconds") * 1000));
  const char* check = std::getenv("ZS_CHECK_COLLECTIVES");
  s.check_collectives = c.check_collectives || (check != nullptr && std::string(check) == "1");
  const Fp16Config& f = c.fp16;
  s.fp16.enabled = f.enabled;
  if (f.enabled) {
    s.fp16.static_scale = resolved(f.loss_scale, "fp16.loss_scale");
    s.fp16.initial_scale_power = resolved(f.initial_scale_power, "fp16.initial_scale_power");
    s.fp16.window = resolved(f.loss_scale_window, "fp16.loss_scale_window");
    s.fp16.hysteresis = resolved(f.hysteresis, "fp16.hysteresis");
    s.fp16.min_scale = resolved(f.min_loss_scale, "fp16.min_loss_scale");
  }
  const OptimizerConfig& o = c.optimizer;
  s.optimizer.type = o.type;
  s.optimizer.external = o.external;
  s.optimizer.lamb_max_coeff = o.max_coeff.value_or(s.optimizer.lamb_max_coeff);
  s.optimizer.lamb_min_coeff = o.min_coeff.value_or(s.optimizer.lamb_min_coeff);
  s.optimizer.bias_correction = o.bias_correction;
  s.optimizer.eps_inside_sqrt = o.eps_inside_sqrt;
  s.optimizer.defaults = adam_defaults(o);
  s.scheduler = c.scheduler;
  return s;
}

}  // namespace zeroshard
