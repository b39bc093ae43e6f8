#include "engine/EngineImpl.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>

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
#include "engine/GroupLayout.h"
#include "engine/ParamHome.h"
#include "engine/RankAgreement.h"
#include "engine/StepPipeline.h"
#include "engine/UnitPartition.h"
#include "engine/UnitSchedule.h"
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
namespace {

at::ScalarType dtype_of(Precision p) {
  switch (p) {
    case Precision::Bf16:
      return at::kBFloat16;
    case Precision::Fp16:
      return at::kHalf;
    case Precision::Fp32:
      break;
  }
  return at::kFloat;
}

// communication_data_type; unset leaves each gradient in its dtype, summed in fp32.
std::optional<at::ScalarType> wire_dtype(const std::optional<Precision>& p) {
  if (!p) return std::nullopt;
  return dtype_of(*p);
}

// Debian's libblas.so.3 is OpenBLAS, whose own thread pool is sized from the environment
// when it loads and is not reached by at::set_num_threads: several ranks on one machine
// would each start one BLAS thread per core (measured: 2.2x slower steps, 2 ranks).
void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
}

// A training loop frees and allocates the same large blocks every step. glibc returns
// large freed blocks to the OS and the next step page-faults them back (measured on
// LibTorch 2.6, GPT bench, 2 ranks: stage-0 step 0.175 s -> 0.150 s, forward 57 -> 40 ms
// once freed memory is kept). ZS_MALLOC_KEEP=0 leaves glibc's defaults alone.
void keep_freed_memory() {
  const char* keep = std::getenv("ZS_MALLOC_KEEP");
  if (keep != nullptr && std::string(keep) == "0") return;
  constexpr int kThreshold = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kThreshold);
  mallopt(M_TRIM_THRESHOLD, kThreshold);
}

}  // namespace

EngineImpl::EngineImpl(std::shared_ptr<torch::nn::Module> module, const Config& config,
                       EngineOptions options, std::optional<LaunchEnv> launch)
    : module_(std::move(module)) {
  const ModuleTree tree = module_tree(*module_);
  if (tree.params.empty()) fail("the module has no parameters to train");
  std::vector<size_t> declared;
  for (const auto& unit : options.units) {
    const auto it = std::find(tree.modules.begin(), tree.modules.end(), unit.get());
    if (it == tree.modules.end()) {
      fail(
          "EngineOptions::units: module '{}' is not a submodule of the model; allowed: modules "
          "the model registers",
          unit->name());
    }
    declared.push_back(static_cast<size_t>(it - tree.modules.begin()));
  }
  std::vector<std::vector<NamedParam>> unit_params;
  for (const UnitNodes& unit : partition_units(tree.nodes, tree.params.size(), declared)) {
    for (size_t m : unit.modules) groups_.map_module(tree.modules[m], UnitId(unit_params.size()));
    unit_params.emplace_back();
    for (size_t p : unit.params) unit_params.back().push_back(tree.params[p]);
  }
  std::vector<NamedBuffer> buffers;
  for (const auto& item : module_->named_buffers(/*recurse=*/true))
    buffers.push_back({item.key(), item.value(), true});
  init(tree.params, unit_params, config, std::move(launch), std::move(options.param_groups), {},
       std::move(buffers));
  std::unordered_map<const void*, std::string> first;
  std::vector<std::pair<std::string, std::string>> aliases;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const auto [it, fresh] = first.emplace(item.value().unsafeGetTensorImpl(), item.key());
    if (!fresh) aliases.emplace_back(item.key(), it->second);
  }
  groups_.set_aliases(std::move(aliases));
}

EngineImpl::EngineImpl(std::vector<NamedParam> params,
                       std::vector<std::vector<NamedParam>> unit_params, const Config& config,
                       std::optional<LaunchEnv> launch, std::vector<ParamGroup> param_groups,
                       MaterializeParams materialize, std::vector<NamedBuffer> buffers,
                       std::optional<AssumedBatch> batch) {
  if (params.empty()) fail("the model has no parameters to train");
  init(std::move(params), unit_params, config, launch, std::move(param_groups), materialize,
       std::move(buffers), batch);
}

void EngineImpl::init(std::vector<NamedParam> params,
                      const std::vector<std::vector<NamedParam>>& unit_params, const Config& config,
                      const std::optional<LaunchEnv>& launch, std::vector<ParamGroup> param_groups,
                      const MaterializeParams& materialize, std::vector<NamedBuffer> buffers,
                      const std::optional<AssumedBatch>& batch) {
  // What every rank must have built alike, agreed on before the first collective.
  BuildDescription built(params, unit_params, param_groups, buffers);
  // Checked before any collective: every rank refuses the same groups alike.
  param_groups_ = ParamGroupTable(std::move(param_groups), params);
  const LaunchEnv env = launch ? *launch : read_launch_env();
  const int threads = threads_per_rank(env, [](const char* n) { return std::getenv(n); });
  at::set_num_threads(threads);
  set_blas_threads(threads);
  check_contradictions(config);
  device_.where = params.front().param.device();
  device_.capacity = device_capacity(device_.where, env.local_world_size);
  buffers_ =
      std::make_unique<ModuleBuffers>(std::move(buffers), config.broadcast_buffers, &ledger_);
  plan_ = plan_for(params, unit_params, buffers_->bytes(), config, env, device_.capacity, batch);
  // Offloaded state comes and goes by design; memory kept by glibc would stay resident
  // (measured, 0.32B model on NVMe: RSS 9.8 GiB kept vs 4.9 GiB counted).
  const TrainingSettings& z = plan_.settings;
  if (!z.offload_optimizer.offloaded() && !z.offload_param.offloaded()) keep_freed_memory();
  const int64_t mics = z.mics_shard_size;
  const int64_t hpz = z.stage.shards_parameters() ? z.hpz_partition_size : 1;
  built.add_config(plan_.config);
  dist_ = init_distributed(
      env, z.comm_timeout, params.front().param.device(),
      z.stage.shards_optimizer() && mics > 0 ? static_cast<int>(mics) : -1, static_cast<int>(hpz),
      [&](c10d::Store& store) { agree_on_build(store, env.rank, env.world_size, built); });
  comms_ = std::make_unique<Communicators>(dist_, &ledger_, z.check_collectives);
  // The groups' lrs as they are now, as DeepSpeed's scheduler reads them when it is built.
  schedule_ = LrSchedule(z.scheduler, param_groups_.lrs(z.optimizer.defaults),
                         /*has_betas=*/!z.optimizer.external);
  pipeline_ = std::make_unique<StepPipeline>(z, world_size());
  IoOptions io;
  io.block_size = z.aio.block_size;
  io.queue_depth = z.aio.queue_depth;
  io.rings = z.aio.rings;
  swap_ = std::make_unique<SwapSpace>(io, rank());
  const MaterializeParams from_rank0 = [this](const std::vector<NamedParam>& group) {
    broadcast_initial_values(group);
  };
  build_groups(params, unit_params, materialize ? materialize : from_rank0);
  groups_.set_params(params);
  buffers_->broadcast(comms_->world());  // every rank starts from rank 0's, as DDP's construction
  const LossScaleSettings& fp16 = z.fp16;
  if (fp16.enabled) {
    LossScalerOptions o;
    o.static_scale = fp16.static_scale;
    o.initial_scale_power = fp16.initial_scale_power;
    o.window = fp16.window;
    o.hysteresis = fp16.hysteresis;
    o.min_scale = fp16.min_scale;
    pipeline_->set_scaler(std::make_unique<LossScaler>(o));
  }
  make_overlapped_step(threads);
}

EngineImpl::~EngineImpl() = default;

void EngineImpl::broadcast_initial_values(const std::vector<NamedParam>& params) {
  // Every rank starts from rank 0's values, whatever each rank's initialisation did.
  std::vector<CommHandle> handles;
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    const CollectiveLabel label("initial value of " + p.name);
    handles.push_back(comms_->world().broadcast(p.param.data(), 0));
  }
  for (auto& h : handles) h.wait();
}

// Which trainable parameter (numbered in layout order, the same on every rank) each
// piece of the optimizer's group `t` holds: elements [begin, begin + count) of `g`.
void EngineImpl::add_param_pieces(const FlatParamGroup& g, size_t t, int64_t begin, int64_t count,
                                  size_t& trained_params) {
  std::vector<ParamPiece> pieces;
  for (const auto& s : g.slots()) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(begin + count, s.offset + s.numel);
    if (lo < hi) {
      pieces.push_back({lo - begin, hi - lo, trained_params, lo - s.offset, s.shape, s.name});
    } else {
      pieces.push_back({0, 0, trained_params, 0, s.shape, s.name});  // on another rank's shard
    }
    ++trained_params;
  }
  pipeline_->optimizer().add_param_pieces(t, std::move(pieces), trained_params);
}

void EngineImpl::build_groups(const std::vector<NamedParam>& params,
                              const std::vector<std::vector<NamedParam>>& unit_params,
                              const MaterializeParams& materialize) {
  const TrainingSettings& z = plan_.settings;
  const ZeroStage stage = z.stage;
  groups_.set_unit_count(unit_params.size());
  const auto layout = layout_groups(params, unit_params, stage, z.reduce_bucket_size);
  const at::ScalarType dtype = dtype_of(z.compute);
  const std::vector<bool> on_host = optimizer_on_host(layout);
  make_optimizer(params.front().param.device().is_cpu(), on_host);
  std::vector<FlatParamGroup*> trainable, sharded;
  size_t trained_params = 0;  // trainable parameters so far, in layout order
  for (const auto& spec : layout) {
    materialize(spec.params);
    GroupRecord record;
    record.flat = std::make_unique<FlatParamGroup>(
        spec.params, shard_rank(), shard_count(), dtype, spec.sharded, spec.trainable,
        /*lazy_grads=*/stage.shards_gradients(), &ledger_);
    FlatParamGroup* g = record.flat.get();
    // Parameter offload on a GPU: the kept shard lives in host memory from here on, where
    // the optimizer updates it and ParamHome moves it to and from NVMe.
    if (z.offload_param.offloaded()) g->keep_shard_on_host(&ledger_);
    if (spec.sharded) {
      record.coordinator_unit = CoordinatorUnit(sharded.size());
      record.unit = UnitId(static_cast<size_t>(spec.unit));
      sharded.push_back(g);
    }
    groups_.add(std::move(record), spec.trainable);
    if (!spec.trainable) continue;
    trainable.push_back(g);
    // Without sharded optimizer state every rank steps the whole group.
    const bool whole = !stage.shards_optimizer();
    const int64_t begin = whole ? 0 : shard_rank() * g->shard_numel();
    const at::Tensor shard = whole ? g->flat() : g->param_shard();
    pipeline_->optimizer().add_group(shard, param_groups_.spans(*g, begin, shard.numel()));
    add_param_pieces(*g, trainable.size() - 1, begin, shard.numel(), trained_params);
  }
  // Shards leave RAM (parameter offload) before the gradient buffers are allocated, so
  // a model as large as host RAM is never held twice.
  pipeline_->optimizer().start();
  std::unique_ptr<ParamHome> home =
      stage.shards_parameters() ? place_param_shards(sharded) : nullptr;
  const bool opt_off = z.offload_optimizer.offloaded();
  ReduceOptions reduce;
  reduce.stage = stage;
  reduce.overlap = z.overlap_comm;
  for (bool host : on_host)
    reduce.fp32_tiers.push_back(opt_off && host ? Tier::Host : Tier::Device);
  reduce.wire = wire_dtype(z.communication);
  pipeline_->set_reducer(std::make_unique<GradReducer>(trainable, reduce, &comms_->shards(),
                                                       comms_->replicas(), &ledger_));
  if (!stage.shards_parameters()) return;
  CoordinatorOptions o;
  o.prefetch_numel = z.stage3_prefetch_bucket_size;
  o.max_live_numel = z.stage3_max_live_parameters;
  o.persistence_numel = z.stage3_param_persistence_threshold;
  auto coordinator =
      std::make_unique<ParamCoordinator>(sharded, &comms_->params(), &comms_->touches(), o);
  if (dist_.hpz_size > 1) {  // a group of every rank gathers as the primary shards do
    coordinator->set_secondary(
        std::make_unique<SecondaryShards>(&comms_->backward_gathers(), sharded.size(), &ledger_));
  }
  if (home) {
    const int lookahead = static_cast<int>(z.offload_param.buffer_count) - 1;
    coordinator->set_shard_home(home.get(), lookahead);
  }
  units_ = std::make_unique<UnitSchedule>(groups_, std::move(coordinator), std::move(home));
  GradReducer& reducer = pipeline_->reducer();
  reducer.on_wait([this] { return units_->coordinator().advance(); });
  reducer.on_gradient([this](size_t group, size_t slot) { check_read(group, slot); });
  // A unit's gradients are in: it goes, unless its frozen group is still read for the
  // gradients of its inputs (engine/UnitRelease.h).
  reducer.on_group_complete([this](size_t group) {
    const std::optional<UnitId> unit = groups_.of_trainable(TrainableId(group)).unit;
    if (unit) units_->grads_done(*unit);
  });
}

void EngineImpl::backward(const at::Tensor& loss, bool retain_graph) {
  std::optional<c10::Stream> stream;  // where an overlapped step's copies are ordered after
  const c10::Device where = device_.where;
  if (!where.is_cpu()) stream = c10::impl::getDeviceGuardImpl(where.type())->getStream(where);
  const at::Tensor scaled = pipeline_->begin_backward(
      loss, [this] { return param_group_hypers(); }, stream);
  if (units_) units_->end_forward();
  scaled.backward({}, retain_graph);
  if (units_) units_->end_backward();
  fault_point("backward.end");
  pipeline_->end_backward();
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
      if (!g->sharded()) handles.push_back(comms_->shards().all_gather(g->flat()));
    }
    for (auto& handle : handles) handle.wait();
  }
  if (units_) units_->coordinator().after_step();
  pipeline_->reducer().zero();
  buffers_->after_step(comms_->world());
  return true;
}

void EngineImpl::zero_grad() {
  pipeline_->zero_grad();
}

int64_t EngineImpl::bytes_sent() const {
  return comms_->bytes_sent();
}

void EngineImpl::barrier() {
  at::Tensor token = at::zeros({1});
  comms_->world().all_reduce_sum(token).wait();
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
    shape.sharded = record.flat->sharded();
    shape.trainable = record.trainable.has_value();
    shapes.push_back(shape);
  }
  return zeroshard::spec_of_groups(shapes, buffers_->bytes());
}

ParamHome* EngineImpl::param_home() const {
  return units_ ? units_->home() : nullptr;
}

CheckpointParts EngineImpl::checkpoint_parts() {
  return {plan_,         dist_,     *comms_,      groups_,      *pipeline_,
          param_groups_, *buffers_, param_home(), units_.get(), device_.where};
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

MemoryDetail EngineImpl::memory_report() const {
  MemoryDetail r;
  r.measured = ledger_.snapshot();
  r.device_capacity = device_.capacity;
  r.allocator = allocator_stats(device_.where);
  WorldShape world{1, world_size()};
  ModelSpec spec = spec_of_groups();
  TrainingShape shape;
  if (device_.activations) {
    take_shape(spec, device_.activations->first);
    shape = device_.activations->second;
  }
  shape.device_is_host = device_.where.is_cpu();
  r.predicted = plan_.predict(spec, world, shape);
  return r;
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
