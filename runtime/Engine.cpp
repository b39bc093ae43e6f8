#include "runtime/Engine.h"

#include <unistd.h>

#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "common/Bytes.h"
#include "common/Error.h"
#include "runtime/LrSchedule.h"
#include "sharding/Collectives.h"
#include "sharding/GradReducer.h"
#include "sharding/LossScaler.h"
#include "sharding/OptimizerShard.h"

namespace zeroshard {
namespace {

// Parameters in registration order, each once (tied parameters share one tensor).
std::vector<NamedParam> unique_parameters(torch::nn::Module& module) {
  std::vector<NamedParam> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      out.push_back({item.key(), item.value()});
    }
  }
  if (out.empty()) fail("the module has no parameters to train");
  return out;
}

at::ScalarType compute_dtype(const Config& c) {
  if (c.bf16) return at::kBFloat16;
  if (c.fp16.enabled) return at::kHalf;
  return at::kFloat;
}

int64_t host_ram() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

ModelSpec spec_of(const std::vector<NamedParam>& params) {
  ModelSpec spec;
  spec.source = "module";
  spec.model_type = "module";
  for (const auto& p : params) {
    spec.total_params += p.param.numel();
    spec.tensor_counts.push_back({p.param.numel(), 1});
  }
  spec.unit_params = {spec.total_params};
  spec.largest_module_params = spec.total_params;
  return spec;
}

Plan plan_for(const std::vector<NamedParam>& params, const Config& config, const LaunchEnv& env) {
  HardwareBudget budget;  // CPU tensors: the device is host memory
  budget.device_bytes = host_ram() / std::max(1, env.local_world_size);
  budget.host_bytes = host_ram();
  WorldShape world{env.world_size / std::max(1, env.local_world_size), env.local_world_size};
  if (world.ranks() != env.world_size) world = WorldShape{1, env.world_size};
  return make_plan(spec_of(params), config, world, TrainingShape{}, budget);
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> module, const Config& config,
               EngineOptions options)
    : module_(std::move(module)) {
  const LaunchEnv env = options.launch ? *options.launch : read_launch_env();
  at::set_num_threads(threads_per_rank(env, [](const char* n) { return std::getenv(n); }));
  check_contradictions(config);
  const auto params = unique_parameters(*module_);
  plan_ = plan_for(params, config, env);
  if (*plan_.config.zero.stage == 3) fail("zero_optimization.stage 3 is not available yet");
  if (plan_.option.optimizer != OffloadDevice::None || plan_.option.params != OffloadDevice::None) {
    fail("zero_optimization offload ({}) is not available yet; allowed: device none",
         plan_.option.label());
  }
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(*plan_.config.comm_timeout_seconds * 1000));
  dist_ = init_distributed(env, timeout);
  comm_ = std::make_unique<Collectives>(
      dist_.group, env.rank, env.world_size, [this] { return dist_.describe_missing_ranks(); },
      &ledger_);
  broadcast_initial_values(params);
  build_groups(params);
  const auto& fp16 = plan_.config.fp16;
  if (fp16.enabled) {
    LossScalerOptions o;
    o.static_scale = *fp16.loss_scale;
    o.initial_scale_power = *fp16.initial_scale_power;
    o.window = *fp16.loss_scale_window;
    o.hysteresis = *fp16.hysteresis;
    o.min_scale = *fp16.min_loss_scale;
    scaler_ = std::make_unique<LossScaler>(o);
  }
}

Engine::~Engine() = default;

void Engine::broadcast_initial_values(const std::vector<NamedParam>& params) {
  // Every rank starts from rank 0's values, whatever each rank's initialisation did.
  std::vector<CommHandle> handles;
  at::NoGradGuard no_grad;
  for (const auto& p : params) handles.push_back(comm_->broadcast(p.param.data(), 0));
  for (auto& h : handles) h.wait();
}

void Engine::build_groups(const std::vector<NamedParam>& params) {
  const int stage = static_cast<int>(*plan_.config.zero.stage);
  const int64_t bucket = *plan_.config.zero.reduce_bucket_size;
  const at::ScalarType dtype = compute_dtype(plan_.config);
  std::vector<NamedParam> trainable, frozen;
  for (const auto& p : params) (p.param.requires_grad() ? trainable : frozen).push_back(p);
  auto add_groups = [&](const std::vector<NamedParam>& list, bool with_grads) {
    std::vector<NamedParam> current;
    int64_t size = 0;
    auto flush = [&] {
      if (current.empty()) return;
      groups_.push_back(std::make_unique<FlatParamGroup>(current, rank(), world_size(), dtype,
                                                         /*sharded=*/false, with_grads, &ledger_));
      current.clear();
      size = 0;
    };
    for (const auto& p : list) {
      if (size > 0 && size + p.param.numel() > bucket) flush();
      current.push_back(p);
      size += p.param.numel();
    }
    flush();
  };
  add_groups(trainable, true);
  const size_t trainable_groups = groups_.size();
  add_groups(frozen, false);
  std::vector<FlatParamGroup*> with_grads;
  optimizer_ = std::make_unique<OptimizerShard>(&ledger_);
  for (size_t i = 0; i < trainable_groups; ++i) {
    with_grads.push_back(groups_[i].get());
    optimizer_->add_group(stage == 0 ? groups_[i]->flat() : groups_[i]->param_shard());
  }
  reducer_ = std::make_unique<GradReducer>(with_grads, stage, plan_.config.zero.overlap_comm,
                                           comm_.get(), &ledger_);
}

void Engine::backward(const at::Tensor& loss) {
  ++micro_steps_;
  reducer_->begin_backward(micro_steps_ % *plan_.config.gradient_accumulation_steps == 0);
  if (scaler_) {
    (loss * scaler_->scale()).backward();
  } else {
    loss.backward();
  }
  reducer_->end_backward();
}

bool Engine::step() {
  const auto& c = plan_.config;
  const int64_t accumulation = *c.gradient_accumulation_steps;
  if (micro_steps_ == 0 || micro_steps_ % accumulation != 0) return false;
  const auto& grads = reducer_->reduced();
  double scale = 1.0 / static_cast<double>(world_size() * accumulation);
  if (scaler_) {
    scale /= scaler_->scale();
    if (scaler_->update(reducer_->any_overflow())) {
      reducer_->zero();
      return false;
    }
  }
  grad_norm_ = reducer_->global_norm(scale);
  const double max_norm = *c.gradient_clipping;
  if (max_norm > 0) {
    const double coefficient = max_norm / (grad_norm_ + 1e-6);  // torch's clip_grad_norm_
    if (coefficient < 1) scale *= coefficient;
  }
  AdamHyper h;
  h.lr = lr();
  h.beta1 = *c.optimizer.beta1;
  h.beta2 = *c.optimizer.beta2;
  h.eps = *c.optimizer.eps;
  h.weight_decay = *c.optimizer.weight_decay;
  h.decoupled = c.optimizer.type == "AdamW";
  optimizer_->step(grads, scale, h);
  if (*c.zero.stage >= 1) {
    std::vector<CommHandle> handles;
    for (size_t i = 0; i < optimizer_->states().size(); ++i) {
      handles.push_back(comm_->all_gather(groups_[i]->flat()));
    }
    for (auto& handle : handles) handle.wait();
  }
  reducer_->zero();
  return true;
}

void Engine::zero_grad() {
  reducer_->zero();
}

double Engine::loss_scale() const {
  return scaler_ ? scaler_->scale() : 1.0;
}

double Engine::lr() const {
  return learning_rate(plan_.config, optimizer_->steps());
}

int64_t Engine::optimizer_steps() const {
  return optimizer_->steps();
}

ModelSpec Engine::spec_of_groups() const {
  ModelSpec spec;
  spec.source = "module";
  spec.model_type = "module";
  for (const auto& g : groups_) {
    spec.unit_params.push_back(g->numel());
    spec.total_params += g->numel();
  }
  spec.largest_module_params = spec.largest_unit();
  return spec;
}

MemoryReport Engine::memory_report() const {
  MemoryReport r;
  r.measured = ledger_.snapshot();
  WorldShape world{1, world_size()};
  r.predicted =
      predict_memory(spec_of_groups(), plan_.option, plan_.config, world, TrainingShape{});
  r.predicted.at(Tier::Device, Kind::CommBuckets) = 0;  // transient; compared as peaks
  return r;
}

std::string MemoryReport::to_string() const {
  std::string out =
      fmt::format("{:<18} {:>12} {:>12} {:>12}\n", "kind (bytes)", "current", "peak", "predicted");
  for (size_t k = 0; k < kNumKinds; ++k) {
    const auto kind = static_cast<Kind>(k);
    out += fmt::format("{:<18} {:>12} {:>12} {:>12}\n", kind_name(kind), measured.current[0][k],
                       measured.peak[0][k], predicted.at(Tier::Device, kind));
  }
  return out;
}

}  // namespace zeroshard
