#include "engine/EngineImpl.h"

#include "engine/EngineBuilder.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "common/Bytes.h"
#include "common/Error.h"
#include "common/FaultPoint.h"
#include "config/LrSchedule.h"
#include "engine/Communicators.h"
#include "engine/DeviceMemory.h"
#include "engine/EnginePlan.h"
#include "engine/ExpertParallel.h"
#include "engine/GroupLayout.h"
#include "engine/ParamHome.h"
#include "engine/RankAgreement.h"
#include "engine/StepPipeline.h"
#include "engine/UnitPartition.h"
#include "engine/UnitSchedule.h"
#include "offload/ActivationStore.h"
#include "optim/OffloadOptimizer.h"
#include "optim/OverlappedStep.h"
#include "optim/ResidentOptimizer.h"
#include "optim/SwapSpace.h"  // the members it destroys
#include "sharding/Collectives.h"
#include "sharding/GradReducer.h"
#include "sharding/LossScaler.h"
#include "sharding/ParamCoordinator.h"
#include "sharding/SecondaryShards.h"

namespace zeroshard {
EngineImpl::EngineImpl(std::shared_ptr<torch::nn::Module> module, const Config& config,
                       EngineOptions options, std::optional<LaunchEnv> launch) {
  EngineBuilder(*this).build(std::move(module), config, std::move(options), std::move(launch));
}

EngineImpl::EngineImpl(std::vector<NamedParam> params,
                       std::vector<std::vector<NamedParam>> unit_params, const Config& config,
                       std::optional<LaunchEnv> launch, std::vector<ParamGroup> param_groups,
                       MaterializeParams materialize, std::vector<NamedBuffer> buffers,
                       std::optional<AssumedBatch> batch) {
  EngineBuilder(*this).build(std::move(params), std::move(unit_params), config, std::move(launch),
                             std::move(param_groups), std::move(materialize), std::move(buffers),
                             std::move(batch));
}

EngineImpl::~EngineImpl() {
  if (activation_store_) activation_store_->detach();  // a graph may still hold its blocks
}

std::shared_ptr<ActivationStore> EngineImpl::activation_store() {
  if (activation_store_) return activation_store_;
  const ActivationOffloadConfig& o = config().activation_offload;
  const AioSettings& aio = plan_.settings.aio;
  IoOptions io;
  io.block_size = aio.block_size;
  io.queue_depth = aio.queue_depth;
  io.rings = aio.rings;
  const bool nvme = o.device == OffloadDevice::Nvme;
  activation_store_ = std::make_shared<ActivationStore>(
      &ledger_, o.pin_memory && !device_.where.is_cpu(), nvme ? o.nvme_path : std::string(),
      fmt::format("rank{}-activations", rank()), io);
  return activation_store_;
}

void EngineImpl::backward(const at::Tensor& loss, bool retain_graph) {
  begin_backward(loss).backward({}, retain_graph);
  end_backward();
}

at::Tensor EngineImpl::begin_backward(const at::Tensor& loss) {
  const at::Tensor scaled = open_backward(loss);
  if (units_) units_->end_forward();
  return scaled;
}

void EngineImpl::end_backward() {
  if (units_) units_->end_backward();
  end_weight_backward();
}

at::Tensor EngineImpl::open_backward(const at::Tensor& loss) {
  std::optional<c10::Stream> stream;  // where an overlapped step's copies are ordered after
  const c10::Device where = device_.where;
  if (!where.is_cpu()) stream = c10::impl::getDeviceGuardImpl(where.type())->getStream(where);
  return pipeline_->begin_backward(
      loss, [this] { return param_group_hypers(); }, stream);
}

at::Tensor EngineImpl::begin_input_backward(const at::Tensor& loss) {
  if (units_) units_->end_forward();
  return loss * pipeline_->loss_scale();
}

void EngineImpl::end_input_backward() {
  if (units_) units_->end_backward();
}

void EngineImpl::begin_weight_backward() {
  open_backward(at::zeros({}));
}

void EngineImpl::end_weight_backward() {
  fault_point("backward.end");
  pipeline_->end_backward();
}

void EngineImpl::keep_units_gathered_in_step() {
  if (!units_) return;
  constexpr int64_t kEveryUnit = std::numeric_limits<int64_t>::max();
  plan_.settings.stage3_param_persistence_threshold = kEveryUnit;
  units_->coordinator().set_persistence_numel(kEveryUnit);
}

void EngineImpl::reduce_once_per_step() {
  if (!plan_.settings.stage.shards_gradients()) return;  // stages 0-1 do already
  pipeline_->reducer().reduce_once_per_window();
  grads_held_in_window_ = true;
}

void EngineImpl::set_pipeline_stages_on_rank(int stages) {
  pipeline_->set_backwards_per_micro_step(stages);
}

bool EngineImpl::step() {
  // Shards kept in host memory may still be read by a gather's copy to the GPU (one
  // with no backward since, as after an evaluation's forward): the step writes them.
  for (const GroupRecord& g : groups_) g.flat->settle_shard_read();
  if (!pipeline_->update([this] { return param_group_hypers(); })) return false;
  return finish_step();
}

// After the update: the updated shards reach every rank that holds the whole group.
bool EngineImpl::finish_step() {
  const TrainingSettings& c = plan_.settings;
  if (ParamHome* home = param_home()) home->flush();
  fault_point("step.gather");
  if (c.stage.shards_optimizer()) {  // each rank updated its part of the whole groups
    std::vector<CommHandle> handles;
    for (const GroupId i : groups_.trainable()) {
      const auto& g = groups_[i].flat;
      if (!g->sharded()) handles.push_back(comms_->shards(groups_[i].expert).all_gather(g->flat()));
    }
    for (auto& handle : handles) handle.wait();
  }
  if (units_) units_->coordinator().after_step();
  pipeline_->reducer().zero();
  buffers_->after_step(comms_->data_parallel());
  return true;
}

void EngineImpl::zero_grad() {
  pipeline_->zero_grad();
}

int64_t EngineImpl::bytes_sent() const {
  return comms_->bytes_sent();
}

void EngineImpl::barrier() {
  // Across the data-parallel group, then the tp group (the whole stage), then the pp group
  // (one rank of every stage, each past its own stage's): every rank of the job.
  at::Tensor token = at::zeros({1});
  comms_->data_parallel().all_reduce_sum(token).wait();
  if (Collectives* tp = comms_->tensor_parallel()) tp->all_reduce_sum(token).wait();
  if (Collectives* pp = comms_->pipeline_parallel()) pp->all_reduce_sum(token).wait();
}

std::vector<NamedParam> EngineImpl::full_parameters() {
  at::NoGradGuard no_grad;
  std::unordered_map<const void*, at::Tensor> copies;
  for (const GroupRecord& record : groups_) {
    const auto& g = record.flat;
    const bool gather = g->sharded() && !g->gathered();
    if (gather) units_->coordinator().gather_now(record.coordinator_unit->value);
    for (const auto& slot : g->slots()) {
      copies[slot.param.unsafeGetTensorImpl()] = slot.param.detach().clone();
    }
    if (gather) units_->coordinator().release_now(record.coordinator_unit->value);
  }
  std::vector<NamedParam> out;
  if (!module_) {
    for (const auto& p : groups_.params())
      out.push_back({p.name, copies.at(p.param.unsafeGetTensorImpl())});
    return out;
  }
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    out.push_back({item.key(), copies.at(item.value().unsafeGetTensorImpl())});
  }
  return out;
}

double EngineImpl::loss_scale() const {
  return pipeline_->loss_scale();
}

double EngineImpl::global_grad_norm() const {
  return pipeline_->grad_norm();
}

double EngineImpl::lr() const {
  return param_group_hypers().front().lr;
}

void EngineImpl::set_param_group(size_t group, const ParamGroupOptions& options) {
  param_groups_.set_options(group, options);
  pipeline_->hypers_changed();
}

std::vector<ScheduledGroup> EngineImpl::scheduled_now() const {
  const int64_t advanced = pipeline_->schedule_steps();
  if (held_schedule_ && held_schedule_->advanced == advanced) return held_schedule_->values;
  return schedule_.at(advanced);
}

std::vector<AdamHyper> EngineImpl::param_group_hypers() const {
  const AdamHyper& defaults = plan_.settings.optimizer.defaults;
  if (!schedule_.active()) return param_groups_.resolve(defaults);
  const std::vector<ScheduledGroup> scheduled = scheduled_now();
  return param_groups_.resolve(defaults, &scheduled);
}

int64_t EngineImpl::optimizer_steps() const {
  return pipeline_->optimizer().steps();
}

ModelSpec EngineImpl::spec_of_groups() const {
  std::vector<GroupShape> shapes;
  for (const auto& record : groups_) {
    GroupShape shape;
    shape.numel = record.flat->numel();
    shape.quantizable = record.flat->quantizable_numel();
    shape.sharded = record.flat->sharded();
    shape.trainable = record.trainable.has_value();
    shape.expert = record.expert;
    shapes.push_back(shape);
  }
  ModelSpec spec = zeroshard::spec_of_groups(shapes, buffers_->bytes());
  spec.expert_parallel = plan_.settings.expert_parallel_size;
  return spec;
}

ParamHome* EngineImpl::param_home() const {
  return units_ ? units_->home() : nullptr;
}

void EngineImpl::set_expert_names(ExpertNames names) {
  expert_names_ = std::move(names);
}

CheckpointParts EngineImpl::checkpoint_parts() {
  return {plan_,     dist_,        *comms_,      groups_,       *pipeline_,   param_groups_,
          *buffers_, param_home(), units_.get(), device_.where, expert_names_};
}

std::string EngineImpl::save_checkpoint(const std::string& dir, std::string tag,
                                        const std::string& client_state_json,
                                        const std::string& lr_scheduler_json,
                                        const SaveOptions& options) {
  return Checkpointer(checkpoint_parts())
      .save(dir, std::move(tag), client_state_json, lr_scheduler_json, options);
}

LoadedCheckpoint EngineImpl::load_checkpoint(const std::string& dir, const std::string& tag,
                                             const LoadOptions& options) {
  std::vector<ScheduledGroup> before;
  if (schedule_.active()) before = scheduled_now();
  LoadedCheckpoint loaded = Checkpointer(checkpoint_parts()).load(dir, tag, options);
  // DeepSpeed loads its scheduler's position without its optimizer's groups when the
  // optimizer's state stays out: the groups keep the lr they had for one more step, and
  // the scheduler's next advance moves on from the loaded position.
  held_schedule_.reset();
  if (schedule_.active() && options.lr_scheduler && !options.optimizer_states &&
      !options.module_only)
    held_schedule_ = HeldSchedule{pipeline_->schedule_steps(), std::move(before)};
  return loaded;
}

MemoryDetail EngineImpl::memory_detail() const {
  MemoryDetail r;
  r.measured = ledger_.snapshot();
  r.device_capacity = device_.capacity;
  r.allocator = allocator_stats(device_.where);
  ModelSpec spec = spec_of_groups();
  const TrainingShape shape = counted_shape(spec);
  r.predicted = plan_.predict(spec, WorldShape{1, data_parallel_size()}, shape);
  return r;
}

TrainingShape EngineImpl::counted_shape(ModelSpec& spec) const {
  TrainingShape shape;
  if (device_.activations) {
    take_shape(spec, device_.activations->first);
    shape = device_.activations->second;
    std::tie(shape.in_flight, shape.pipeline_micro_batches) = pipeline_in_flight_;
  }
  shape.device_is_host = device_.where.is_cpu();
  shape.grads_held_in_window = grads_held_in_window_;
  if (config().activation_checkpointing_mode == "auto" && device_.activations) {
    // The fewest blocks with which the plan's stage and offload fit the capacity it was
    // made for, at this batch.
    HardwareBudget budget;
    budget.device_bytes = device_.capacity;
    budget.host_bytes = host_memory_bytes();
    shape.recomputed =
        plan_.recomputed_for(spec, WorldShape{1, data_parallel_size()}, shape, budget);
  }
  return shape;
}

std::optional<Recomputed> EngineImpl::recomputed_layers() const {
  if (!device_.activations) return std::nullopt;
  ModelSpec spec = spec_of_groups();
  const TrainingShape shape = counted_shape(spec);
  return zeroshard::recomputed_layers(spec, config(), shape);
}

MemoryReport MemoryDetail::to_public() const {
  MemoryReport r;
  for (size_t t = 0; t < kNumTiers; ++t) {
    const auto tier = static_cast<Tier>(t);
    int64_t predicted_total = 0;
    for (size_t k = 0; k < kNumKinds; ++k) {
      const auto kind = static_cast<Kind>(k);
      r.uses.push_back({tier_name(tier), kind_name(kind), measured.current[t][k],
                        measured.peak[t][k], predicted.at(tier, kind)});
      predicted_total += predicted.at(tier, kind);
    }
    r.tiers.push_back({tier_name(tier), measured.current_total(tier), measured.peak_total(tier),
                       predicted_total});
  }
  r.device_capacity = device_capacity;
  r.allocator = allocator;
  return r;
}

std::string MemoryReport::to_string() const {
  std::string out =
      fmt::format("{:<18} {:>12} {:>12} {:>12}\n", "kind (bytes)", "current", "peak", "predicted");
  for (const MemoryUse& use : uses) {
    if (use.tier != "device") continue;
    out += fmt::format("{:<18} {:>12} {:>12} {:>12}\n", use.kind, use.current, use.peak,
                       use.predicted);
  }
  out += fmt::format("device capacity planned with: {} bytes\n", device_capacity);
  if (allocator) {
    out +=
        fmt::format("CUDA caching allocator: {} allocated, {} peak allocated, {} peak reserved\n",
                    allocator->allocated, allocator->peak_allocated, allocator->peak_reserved);
  }
  return out;
}

}  // namespace zeroshard
