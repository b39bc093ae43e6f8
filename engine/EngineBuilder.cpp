// How an engine is assembled (engine/EngineBuilder.h): the plan, the process groups, the
// flat groups, where offloaded parameters live, the stage-3 units (the optimizer:
// EngineOptimizer.cpp).
#include "engine/EngineBuilder.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "common/Alignment.h"
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
#include "engine/QuantizedWeights.h"
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

#include "plan/MemoryModel.h"
#include "sharding/FlatParamGroup.h"

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

void EngineBuilder::build(std::shared_ptr<torch::nn::Module> module, const Config& config,
                          EngineOptions options, std::optional<LaunchEnv> launch) {
  e_->module_ = std::move(module);
  const ModuleTree tree = module_tree(*e_->module_);
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
    for (size_t m : unit.modules)
      e_->groups_.map_module(tree.modules[m], UnitId(unit_params.size()));
    unit_params.emplace_back();
    for (size_t p : unit.params) unit_params.back().push_back(tree.params[p]);
  }
  std::vector<NamedBuffer> buffers;
  for (const auto& item : e_->module_->named_buffers(/*recurse=*/true))
    buffers.push_back({item.key(), item.value(), true});
  init(tree.params, unit_params, config, std::move(launch), std::move(options.param_groups), {},
       std::move(buffers));
  std::unordered_map<const void*, std::string> first;
  std::vector<std::pair<std::string, std::string>> aliases;
  for (const auto& item : e_->module_->named_parameters(/*recurse=*/true)) {
    const auto [it, fresh] = first.emplace(item.value().unsafeGetTensorImpl(), item.key());
    if (!fresh) aliases.emplace_back(item.key(), it->second);
  }
  e_->groups_.set_aliases(std::move(aliases));
}

void EngineBuilder::build(std::vector<NamedParam> params,
                          std::vector<std::vector<NamedParam>> unit_params, const Config& config,
                          std::optional<LaunchEnv> launch, std::vector<ParamGroup> param_groups,
                          MaterializeParams materialize, std::vector<NamedBuffer> buffers,
                          std::optional<AssumedBatch> batch) {
  if (params.empty()) fail("the model has no parameters to train");
  init(std::move(params), unit_params, config, launch, std::move(param_groups), materialize,
       std::move(buffers), batch);
}

void EngineBuilder::init(std::vector<NamedParam> params,
                         const std::vector<std::vector<NamedParam>>& unit_params,
                         const Config& config, const std::optional<LaunchEnv>& launch,
                         std::vector<ParamGroup> param_groups, const MaterializeParams& materialize,
                         std::vector<NamedBuffer> buffers,
                         const std::optional<AssumedBatch>& batch) {
  // What every rank must have built alike, agreed on before the first collective.
  BuildDescription built(params, unit_params, param_groups, buffers);
  // Checked before any collective: every rank refuses the same groups alike.
  e_->param_groups_ = ParamGroupTable(std::move(param_groups), params);
  const LaunchEnv env = launch ? *launch : read_launch_env();
  const int threads = threads_per_rank(env, [](const char* n) { return std::getenv(n); });
  at::set_num_threads(threads);
  set_blas_threads(threads);
  check_contradictions(config);
  // Tensor parallelism is checked before the plan, which divides the ranks by it.
  const int64_t tp = config.tensor_parallel_size.value_or(1);
  const bool any_split = std::any_of(params.begin(), params.end(),
                                     [](const NamedParam& p) { return p.tensor_parallel(); });
  if (tp > 1 && !any_split) {
    fail(
        "config key 'tensor_parallel.autotp_size' is {}, but no parameter is split across the "
        "tensor-parallel ranks; zeroshard does not apply a model's tp_plan itself yet; allowed: "
        "1, or a model whose layers split their parameters (Megatron-style, each marked "
        "tensor_model_parallel=True) given with initialize(mpu=...)",
        tp);
  }
  const int pp = static_cast<int>(config.pipeline_parallel_size.value_or(1));
  // pp divides the ranks, tp a stage's
  const ParallelDims dims(env.world_size, env.rank, -1, 1, static_cast<int>(tp), pp);
  const int64_t sp = config.sequence_parallel_size.value_or(1);
  if (sp > 1 && (tp > 1 || pp > 1)) {
    fail(
        "config key 'sequence_parallel_size' is {} with tensor-parallel size {} and {} pipeline "
        "stage(s); allowed: sequence parallelism alone with ZeRO (tensor_parallel.autotp_size "
        "and pipeline.stages 1), or sequence_parallel_size 1",
        sp, tp, pp);
  }
  const int64_t sample_ranks = dims.size(Dim::Dp) / sp;
  if (config.data_parallel_size && *config.data_parallel_size != sample_ranks) {
    fail(
        "config key 'data_parallel_size' is {}, but {} ranks over tensor-parallel size {}, {} "
        "pipeline stage(s) and sequence-parallel size {} leave {} data-parallel ranks; allowed: "
        "{}, or leave the key out",
        *config.data_parallel_size, env.world_size, tp, pp, sp, sample_ranks, sample_ranks);
  }
  e_->device_.where = params.front().param.device();
  e_->device_.capacity = device_capacity(e_->device_.where, env.local_world_size);
  e_->buffers_ =
      std::make_unique<ModuleBuffers>(std::move(buffers), config.broadcast_buffers, &e_->ledger_);
  e_->plan_ = plan_for(params, unit_params, e_->buffers_->bytes(), config, env,
                       e_->device_.capacity, batch);
  // Offloaded state (activations too) comes and goes by design; memory kept by glibc would
  // stay resident (measured, 0.32B model on NVMe: RSS 9.8 GiB kept vs 4.9 GiB counted).
  const TrainingSettings& z = e_->plan_.settings;
  const bool offloaded = z.offload_optimizer.offloaded() || z.offload_param.offloaded() ||
                         e_->plan_.config.activation_offload.device != OffloadDevice::None;
  if (!offloaded) keep_freed_memory();
  if (z.tensor_parallel_size > 1 && z.optimizer.lamb()) {
    fail(
        "config key 'optimizer.type' is Lamb with tensor_parallel.autotp_size {}; allowed: an "
        "elementwise optimizer (Adam, AdamW, a torch.optim class): Lamb's per-parameter norms "
        "would be of this rank's slices, not of the parameters",
        z.tensor_parallel_size);
  }
  check_expert_parallel(z, params);
  const int64_t mics = z.mics_shard_size;
  const int64_t hpz = z.stage.shards_parameters() ? z.hpz_partition_size : 1;
  built.add_config(e_->plan_.config);
  e_->dist_ = init_distributed(
      env, z.comm_timeout, params.front().param.device(),
      z.stage.shards_optimizer() && mics > 0 ? static_cast<int>(mics) : -1, static_cast<int>(hpz),
      [&](c10d::Store& store) {
        // Each pipeline stage builds its own part of the model: its ranks agree among
        // themselves, under a prefix of their own.
        if (pp == 1) return agree_on_build(store, env.rank, env.world_size, built);
        // The stages train one model: what they were given is one config (its auto keys
        // then resolve per stage), agreed across the whole world first.
        BuildDescription given;
        given.add_config(config, "config (as given to each pipeline stage)",
                         "give every pipeline stage the same config");
        const auto shared = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(&store);
        c10d::PrefixStore stages("stages", shared);
        agree_on_build(stages, env.rank, env.world_size, given);
        c10d::PrefixStore stage(fmt::format("stage{}", dims.coordinate(Dim::Pp)), shared);
        agree_on_build(stage, dims.rank_in_stage(), dims.stage_ranks(), built);
      },
      static_cast<int>(z.tensor_parallel_size), pp, static_cast<int>(z.expert_parallel_size));
  e_->comms_ = std::make_unique<Communicators>(e_->dist_, &e_->ledger_, z.check_collectives);
  // The groups' lrs as they are now, as DeepSpeed's scheduler reads them when it is built.
  e_->schedule_ = LrSchedule(z.scheduler, e_->param_groups_.lrs(z.optimizer.defaults),
                             /*has_betas=*/!z.optimizer.external);
  e_->pipeline_ = std::make_unique<StepPipeline>(z, e_->data_parallel_size());
  IoOptions io;
  io.block_size = z.aio.block_size;
  io.queue_depth = z.aio.queue_depth;
  io.rings = z.aio.rings;
  e_->swap_ = std::make_unique<SwapSpace>(io, e_->rank());
  const MaterializeParams from_rank0 = [this](const std::vector<NamedParam>& group) {
    broadcast_initial_values(group);
  };
  build_groups(params, unit_params, materialize ? materialize : from_rank0);
  e_->groups_.set_params(params);
  // Every rank starts from rank 0's buffers, as DDP's construction does.
  e_->buffers_->broadcast(e_->comms_->data_parallel());
  const LossScaleSettings& fp16 = z.fp16;
  if (fp16.enabled) {
    LossScalerOptions o;
    o.static_scale = fp16.static_scale;
    o.initial_scale_power = fp16.initial_scale_power;
    o.window = fp16.window;
    o.hysteresis = fp16.hysteresis;
    o.min_scale = fp16.min_scale;
    e_->pipeline_->set_scaler(std::make_unique<LossScaler>(o));
  }
  make_overlapped_step(threads);
}

void EngineBuilder::broadcast_initial_values(const std::vector<NamedParam>& params) {
  // Every rank starts from rank 0's values, whatever each rank's initialisation did.
  std::vector<CommHandle> handles;
  at::NoGradGuard no_grad;
  for (const auto& p : params) {  // an expert's from the first rank holding its experts
    const CollectiveLabel label("initial value of " + p.name);
    handles.push_back(e_->comms_->broadcasts(p.expert).broadcast(p.param.data(), 0));
  }
  for (auto& h : handles) h.wait();
}

// Which trainable parameter (numbered in layout order, the same on every rank) each
// piece of the optimizer's group `t` holds: elements [begin, begin + count) of `g`.
void EngineBuilder::add_param_pieces(const FlatParamGroup& g, size_t t, int64_t begin,
                                     int64_t count, size_t& trained_params) {
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
  e_->pipeline_->optimizer().add_param_pieces(t, std::move(pieces), trained_params);
}

void EngineBuilder::build_groups(const std::vector<NamedParam>& params,
                                 const std::vector<std::vector<NamedParam>>& unit_params,
                                 const MaterializeParams& materialize) {
  const TrainingSettings& z = e_->plan_.settings;
  const ZeroStage stage = z.stage;
  e_->groups_.set_unit_count(unit_params.size());
  const auto layout = layout_groups(params, unit_params, stage, z.reduce_bucket_size);
  const at::ScalarType dtype = dtype_of(z.compute);
  const std::vector<bool> on_host = optimizer_on_host(layout);
  make_optimizer(params.front().param.device().is_cpu(), on_host);
  std::vector<FlatParamGroup*> trainable, sharded;
  // Parameter offload: each unit's shard leaves for its tier as soon as it is built
  // (a trainable one on NVMe after the optimizer has read it), so construction holds one
  // unit's parameters, not the model's.
  const bool offload = stage.shards_parameters() && z.offload_param.offloaded();
  if (z.weight_quantization.bits > 0) {
    check_quantized_weights(params, z.weight_quantization);
    e_->quantizer_ = std::make_unique<ShardQuantizer>(z.weight_quantization);
  }
  std::vector<bool> on_nvme, sharded_trainable;
  std::unique_ptr<ParamHome> home = offload ? make_param_home(layout, on_nvme) : nullptr;
  size_t trained_params = 0;  // trainable parameters so far, in layout order
  // Tensor parallelism: what this rank's norm leaves to tp coordinate 0 (sharding/GradReducer.h).
  const bool counts_whole_params = e_->dist_.dims.coordinate(Dim::Tp) == 0;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> counted_elsewhere;
  for (const auto& spec : layout) {
    materialize(spec.params);
    GroupRecord record;
    const int shard_rank = e_->dist_.shard_rank(spec.expert);
    record.expert = spec.expert;
    record.flat =
        std::make_unique<FlatParamGroup>(spec.params, shard_rank, e_->dist_.shard_size(spec.expert),
                                         dtype, spec.sharded, spec.trainable,
                                         /*lazy_grads=*/stage.shards_gradients(), &e_->ledger_,
                                         spec.trainable ? nullptr : e_->quantizer_.get());
    FlatParamGroup* g = record.flat.get();
    // Parameter offload on a GPU: the kept shard lives in host memory from here on, where
    // the optimizer updates it and ParamHome moves it to and from NVMe.
    if (z.offload_param.offloaded()) g->keep_shard_on_host(&e_->ledger_);
    if (spec.sharded) {
      const size_t u = sharded.size();
      record.coordinator_unit = CoordinatorUnit(u);
      record.unit = UnitId(static_cast<size_t>(spec.unit));
      sharded.push_back(g);
      sharded_trainable.push_back(spec.trainable);
      if (offload && !on_nvme[u]) g->set_shard_tier(Tier::Host, &e_->ledger_);
      if (home && on_nvme[u]) {
        home->adopt(u, g);
        if (!spec.trainable) home->store(u);
      }
    }
    e_->groups_.add(std::move(record), spec.trainable);
    if (!spec.trainable) continue;
    trainable.push_back(g);
    // Without sharded optimizer state every rank steps the whole group.
    const bool whole = !stage.shards_optimizer();
    const int64_t begin = whole ? 0 : shard_rank * g->shard_numel();
    const at::Tensor shard = whole ? g->flat() : g->param_shard();
    e_->pipeline_->optimizer().add_group(shard, e_->param_groups_.spans(*g, begin, shard.numel()));
    add_param_pieces(*g, trainable.size() - 1, begin, shard.numel(), trained_params);
    counted_elsewhere.emplace_back();
    if (counts_whole_params) continue;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      if (spec.params[i].tensor_parallel()) continue;
      const auto& s = g->slots()[i];
      const int64_t lo = std::max(begin, s.offset);
      const int64_t hi = std::min(begin + shard.numel(), s.offset + s.numel);
      if (lo < hi) counted_elsewhere.back().emplace_back(lo - begin, hi - lo);
    }
  }
  // Shards leave RAM (parameter offload) before the gradient buffers are allocated, so
  // a model as large as host RAM is never held twice.
  e_->pipeline_->optimizer().start();
  if (home) {
    for (size_t u = 0; u < sharded.size(); ++u)
      if (on_nvme[u] && sharded_trainable[u]) home->store(u);
    home->flush();
    hook_param_home(home.get());
  }
  const bool opt_off = z.offload_optimizer.offloaded();
  ReduceOptions reduce;
  reduce.stage = stage;
  reduce.overlap = z.overlap_comm;
  for (bool host : on_host)
    reduce.fp32_tiers.push_back(opt_off && host ? Tier::Host : Tier::Device);
  reduce.wire = wire_dtype(z.communication);
  reduce.counted_on_another_tp_rank = std::move(counted_elsewhere);
  e_->pipeline_->set_reducer(std::make_unique<GradReducer>(trainable, reduce, &e_->comms_->shards(),
                                                           e_->comms_->replicas(), &e_->ledger_));
  e_->pipeline_->reducer().set_tensor_parallel(e_->comms_->tensor_parallel());
  e_->pipeline_->reducer().set_pipeline_parallel(e_->comms_->pipeline_parallel());
  reduce_experts_apart(e_->groups_, *e_->comms_, e_->pipeline_->reducer());
  if (!stage.shards_parameters()) return;
  CoordinatorOptions o;
  o.prefetch_numel = z.stage3_prefetch_bucket_size;
  o.max_live_numel = z.stage3_max_live_parameters;
  o.persistence_numel = e_->plan_.settings.stage3_param_persistence_threshold;
  auto coordinator =
      std::make_unique<ParamCoordinator>(sharded, &e_->comms_->params(), &e_->comms_->touches(), o);
  gather_experts_apart(e_->groups_, *e_->comms_, *coordinator);
  // hpZ: backward gathers from the secondary copy (over every rank when hpz is the world).
  if (e_->dist_.dims.size(Dim::Hpz) > 1) {
    coordinator->set_secondary(std::make_unique<SecondaryShards>(&e_->comms_->backward_gathers(),
                                                                 sharded.size(), &e_->ledger_));
  }
  if (home) {
    const int lookahead = static_cast<int>(z.offload_param.buffer_count) - 1;
    coordinator->set_shard_home(home.get(), lookahead);
  }
  e_->units_ = std::make_unique<UnitSchedule>(e_->groups_, std::move(coordinator), std::move(home));
  GradReducer& reducer = e_->pipeline_->reducer();
  reducer.on_wait([e = e_] { return e->units_->coordinator().advance(); });
  reducer.on_gradient([e = e_](size_t group, size_t slot) { e->check_read(group, slot); });
  // A unit's gradients are in: it goes, unless its frozen group is still read for the
  // gradients of its inputs (engine/UnitRelease.h).
  reducer.on_group_complete([e = e_](size_t group) {
    const std::optional<UnitId> unit = e->groups_.of_trainable(TrainableId(group)).unit;
    if (unit) e->units_->grads_done(*unit);
  });
}

// Stage-3 parameter offload: each sharded unit's shard goes where the memory model
// puts it (the same function decides both).
std::unique_ptr<ParamHome> EngineBuilder::make_param_home(const std::vector<GroupSpec>& layout,
                                                          std::vector<bool>& on_nvme) {
  const TrainingSettings& z = e_->plan_.settings;
  const OffloadDevice device = z.offload_param.device;
  const ParamPlacement placed =
      zeroshard::place_param_shards(spec_of_groups(shapes_of(layout), e_->buffers_->bytes()),
                                    device, z.param_max_in_cpu, e_->shard_count());
  // Coordinator units number the sharded groups in layout order.
  std::vector<int64_t> unit_of_group(layout.size(), -1), unit_bytes;
  for (size_t i = 0; i < layout.size(); ++i) {
    if (!layout[i].sharded) continue;
    unit_of_group[i] = static_cast<int64_t>(unit_bytes.size());
    unit_bytes.push_back(FlatParamGroup::kept_bytes_of(
        layout[i].params, e_->shard_rank(), e_->shard_count(), dtype_of(z.compute),
        layout[i].trainable ? nullptr : e_->quantizer_.get()));
  }
  on_nvme.assign(unit_bytes.size(), device == OffloadDevice::Nvme);
  for (size_t g : placed.in_host) on_nvme[static_cast<size_t>(unit_of_group.at(g))] = false;
  if (device != OffloadDevice::Nvme) return nullptr;
  OffloadOptimizer* offloaded = e_->pipeline_->offloaded();
  if (!offloaded && (z.optimizer.external || z.optimizer.lamb())) {
    fail(
        "config key 'zero_optimization.offload_param.device' is 'nvme' with optimizer {}; "
        "allowed: offload_param.device cpu, or the optimizer Adam or AdamW offloaded to cpu or "
        "nvme, whose step brings each NVMe shard in",
        z.optimizer.type);
  }
  if (!offloaded) {  // the offloaded optimizer brings each NVMe shard in for its update
    fail(
        "config key 'zero_optimization.offload_param.device' is 'nvme' with the optimizer "
        "on the device; allowed: 'zero_optimization.offload_optimizer.device' cpu or nvme "
        "with parameters on NVMe, or offload_param.device cpu");
  }
  const std::string& dir = e_->swap_->open_dir(z.offload_param.nvme_path);  // makes io() first
  return std::make_unique<ParamHome>(std::move(unit_bytes), on_nvme, e_->swap_->io(), dir,
                                     z.offload_param.buffer_count, &e_->ledger_, e_->device_.where);
}

}  // namespace zeroshard
