// Checkpointer::load (the format: engine/Checkpoint.h; saving: Checkpointer.cpp).
#include <sys/stat.h>

#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include "common/Error.h"
#include "common/FaultPoint.h"
#include "common/Files.h"
#include "engine/Checkpoint.h"
#include "engine/Checkpointer.h"
#include "engine/Communicators.h"
#include "engine/ModuleBuffers.h"
#include "engine/ParamGroups.h"
#include "engine/ParamHome.h"
#include "engine/ProcessGroupSetup.h"
#include "engine/ReslicedCheckpoint.h"
#include "engine/RngStates.h"
#include "engine/StagesCheckpoint.h"
#include "engine/StepPipeline.h"
#include "engine/UnitSchedule.h"
#include "optim/ShardOptimizer.h"
#include "plan/Planner.h"
#include "sharding/Collectives.h"
#include "sharding/GradReducer.h"
#include "sharding/LossScaler.h"
#include "sharding/ParamCoordinator.h"

namespace zeroshard {

namespace {

// How many pipeline stages saved DIR/NAME (1: no pipeline.json there).
int saved_stages(const std::string& dir, const std::string& name) {
  const std::string about = dir + "/" + name + "/pipeline.json";
  struct stat st {};
  if (::stat(about.c_str(), &st) != 0) return 1;
  int stages = 0;
  try {
    stages = nlohmann::json::parse(read_whole_file(about, "checkpoint")).at("pp_size");
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint '{}' is not valid: {}", about, e.what());
  }
  if (stages < 1 || stages > 4096)
    fail("checkpoint '{}': pp_size {} is not allowed; allowed: 1 to 4096", about, stages);
  return stages;
}

}  // namespace

// A pipeline stage reads its own stage's part; its data-parallel ranks and tp parts are
// resliced as any checkpoint's. Saved by another number of stages (or without, or read
// without), every saved stage's part is read as one checkpoint, each engine taking its own
// parameters from it by name (engine/StagesCheckpoint.h).
LoadedCheckpoint Checkpointer::load(const std::string& dir, const std::string& tag,
                                    const LoadOptions& options) {
  refuse_quantized(p_.plan.settings, "load");
  check_expert_names("load_checkpoint");
  const std::string name = tag.empty() ? latest_tag(dir) : tag;
  const int stages = p_.dist.dims.size(Dim::Pp), saved = saved_stages(dir, name);
  if (stages == 1 && saved == 1) return load_tensor_parallel(dir, name, options);
  std::string failure;
  LoadedCheckpoint loaded;
  try {
    bool by_name = saved != stages;
    if (!by_name) {  // the same split, unless this stage's part holds other parameters
      const std::string folder = dir + "/" + name;
      const std::string part = pipeline_stage_part(p_.dist.dims.coordinate(Dim::Pp));
      auto parts = tensor_parallel_parts(folder, part);
      by_name = !holds_just_this_engines(*parts.front());
      if (!by_name) loaded = load_tensor_parallel(folder, part, options, std::move(parts));
    }
    if (by_name) {
      std::vector<std::unique_ptr<CheckpointSource>> parts;
      for (int s = 0; s < saved; ++s) {
        parts.push_back(saved == 1
                            ? tensor_parallel_source(dir, name)
                            : tensor_parallel_source(dir + "/" + name, pipeline_stage_part(s)));
      }
      const StagesCheckpoint reader(std::move(parts), dir, name);
      loaded = load_part(reader, dir, options, std::nullopt);
    }
  } catch (const Error& e) {
    failure = e.what();
  }
  // A rank that fails says so to every other (through the pp, tp and data-parallel groups
  // in turn), which would otherwise train on and wait for it in their first exchange.
  at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1, at::kLong);
  if (Collectives* pp = p_.comms.pipeline_parallel()) pp->all_reduce_sum(failed).wait();
  if (Collectives* tp = p_.comms.tensor_parallel()) tp->all_reduce_sum(failed).wait();
  p_.comms.data_parallel().all_reduce_sum(failed).wait();
  if (!failure.empty()) throw Error(failure);
  if (failed.item<int64_t>() > 0) {
    fail("rank {}: loading checkpoint '{}/{}' failed on another rank (its message says why)",
         p_.dist.env.rank, dir, name);
  }
  return loaded;
}

// Whether a saved part holds this engine's parameters and no others (the same split).
bool Checkpointer::holds_just_this_engines(const CheckpointSource& part) const {
  size_t mine = 0;
  for (const auto& record : p_.groups) {
    for (const auto& s : record.flat->slots()) {
      if (!part.has_param(saved_name(record, s.name))) return false;
      ++mine;
    }
  }
  size_t saved = 0;
  for (const auto& g : part.manifest().groups) saved += g.params.size();
  return saved == mine;
}

// DIR/TAG's tp parts (one without tensor parallelism), in tp order.
std::vector<std::unique_ptr<CheckpointReader>> Checkpointer::tensor_parallel_parts(
    const std::string& dir, const std::string& name) const {
  const std::string about = dir + "/" + name + "/tensor_parallel.json";
  int saved_tp = 1;
  struct stat st {};
  if (::stat(about.c_str(), &st) == 0) {
    try {
      saved_tp = nlohmann::json::parse(read_whole_file(about, "checkpoint")).at("tp_size");
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint '{}' is not valid: {}", about, e.what());
    }
    if (saved_tp < 1 || saved_tp > 4096) {
      fail("checkpoint '{}': tp_size {} is not allowed; allowed: 1 to 4096", about, saved_tp);
    }
  }
  std::vector<std::unique_ptr<CheckpointReader>> parts;
  for (int t = 0; t < saved_tp; ++t) {
    const std::string folder = saved_tp == 1 ? dir : dir + "/" + name;
    const std::string part_tag = saved_tp == 1 ? name : tensor_parallel_part(t);
    parts.push_back(std::make_unique<CheckpointReader>(folder, read_manifest(folder, part_tag)));
  }
  return parts;
}

// DIR/TAG as this rank's tp coordinate holds it: the saved part itself at the same tp
// size, else resliced from all of them.
std::unique_ptr<CheckpointSource> Checkpointer::tensor_parallel_source(
    const std::string& dir, const std::string& name) const {
  auto parts = tensor_parallel_parts(dir, name);
  const int tp = p_.dist.dims.size(Dim::Tp);
  if (static_cast<int>(parts.size()) == tp) {
    return std::move(parts.at(static_cast<size_t>(p_.dist.dims.coordinate(Dim::Tp))));
  }
  return std::make_unique<ReslicedCheckpoint>(std::move(parts), tp,
                                              p_.dist.dims.coordinate(Dim::Tp),
                                              p_.groups.tensor_parallel_dims(), dir, name);
}

// With tensor parallelism this tp coordinate's part (engine/Checkpoint.h). A checkpoint
// saved at another tp size is read through a ReslicedCheckpoint over all of its parts.
LoadedCheckpoint Checkpointer::load_tensor_parallel(const std::string& dir, const std::string& name,
                                                    const LoadOptions& options) {
  return load_tensor_parallel(dir, name, options, tensor_parallel_parts(dir, name));
}

LoadedCheckpoint Checkpointer::load_tensor_parallel(
    const std::string& dir, const std::string& name, const LoadOptions& options,
    std::vector<std::unique_ptr<CheckpointReader>> parts) {
  const int saved_tp = static_cast<int>(parts.size());
  const std::string folder = saved_tp == 1 ? dir : dir + "/" + name;
  if (saved_tp == p_.dist.dims.size(Dim::Tp)) {
    const CheckpointReader& reader =
        *parts.at(static_cast<size_t>(p_.dist.dims.coordinate(Dim::Tp)));
    std::optional<std::string> rng;  // each rank's own stream, where it exists
    if (reader.manifest().world_size == p_.dist.dims.size(Dim::Dp)) rng = reader.read_rng(rank());
    return load_part(reader, folder, options, rng);
  }
  const ReslicedCheckpoint reader(std::move(parts), p_.dist.dims.size(Dim::Tp),
                                  p_.dist.dims.coordinate(Dim::Tp),
                                  p_.groups.tensor_parallel_dims(), dir, name);
  return load_part(reader, dir, options, std::nullopt);
}

LoadedCheckpoint Checkpointer::load_part(const CheckpointSource& reader, const std::string& dir,
                                         const LoadOptions& options,
                                         const std::optional<std::string>& rng) {
  const Manifest& m = reader.manifest();
  check_layout(reader, dir, options);  // before anything changes
  const bool with_optimizer = options.optimizer_states && !options.module_only;
  const std::vector<ParamGroupOptions> groups =
      with_optimizer ? saved_param_groups(m, dir) : std::vector<ParamGroupOptions>{};
  const int64_t global_steps = p_.pipeline.global_steps();
  const int64_t schedule_steps = p_.pipeline.schedule_steps();
  at::NoGradGuard no_grad;
  if (with_optimizer) {
    // The step counts first: an optimizer that keeps them per parameter (torch.optim's)
    // sets them as each group's state arrives.
    p_.pipeline.optimizer().set_steps(m.optimizer_steps);
    p_.pipeline.optimizer().set_scalar_state(m.optimizer_scalars.dump());
  }
  for (size_t i = 0; i < p_.groups.size(); ++i) {
    fault_point("load.group");
    if (with_optimizer && p_.groups[GroupId(i)].trainable) {
      load_group(reader, GroupId(i));
    } else {
      load_group_values(reader, GroupId(i));
    }
  }
  load_buffers(reader);
  std::vector<CommHandle> handles;
  for (const GroupId i : p_.groups.trainable()) {
    const GroupRecord& record = p_.groups[i];
    const auto& g = record.flat;
    if (!g->sharded() && p_.plan.settings.stage.shards_optimizer())  // experts: over their edp
      handles.push_back(p_.comms.shards(record.expert).all_gather(g->flat()));
  }
  for (auto& h : handles) h.wait();
  if (p_.param_home) p_.param_home->flush();
  const bool lr_scheduler = options.lr_scheduler && !options.module_only;
  p_.pipeline.set_global_steps(options.module_only ? global_steps : m.global_steps);
  p_.pipeline.set_schedule_steps(lr_scheduler ? m.schedule_steps : schedule_steps);
  if (!options.module_only) {
    p_.pipeline.set_micro_steps(m.micro_steps);
    p_.pipeline.set_skipped_steps(m.skipped_steps);
  }
  for (size_t g = 0; g < groups.size(); ++g) p_.param_groups.set_options(g, groups[g]);
  LossScaler* scaler = p_.pipeline.scaler();
  if (scaler && with_optimizer && !m.loss_scale.is_null()) {
    scaler->restore({m.loss_scale.at("scale").get<double>(),
                     m.loss_scale.at("hysteresis_left").get<int64_t>(),
                     m.loss_scale.at("iteration").get<int64_t>(),
                     m.loss_scale.at("last_overflow").get<int64_t>()});
  }
  p_.pipeline.reducer().zero();
  // Each rank's own random stream, when it exists; a warm start keeps its own.
  if (rng && !options.module_only) {
    restore_rng_states({*rng, m.device_rng_bytes}, p_.device);
  }
  return {m.client_state.dump(), lr_scheduler ? m.lr_scheduler.dump() : "null"};
}

// The saved groups' options, checked before anything changes: as many groups as this
// engine has (none saved: a checkpoint from before groups were stored keeps the
// engine's own).
std::vector<ParamGroupOptions> Checkpointer::saved_param_groups(const Manifest& m,
                                                                const std::string& dir) const {
  std::vector<ParamGroupOptions> out;
  if (m.param_groups.is_null()) return out;
  if (m.param_groups.size() != p_.param_groups.size()) {
    fail(
        "checkpoint '{}/{}' holds {} optimizer parameter group(s), this engine has {}; load "
        "it into an engine built with the same groups (model_parameters or the client "
        "optimizer's param_groups)",
        dir, m.tag, m.param_groups.size(), p_.param_groups.size());
  }
  try {
    for (const auto& j : m.param_groups) out.push_back(param_group_from_json(j));
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint '{}/{}': param_groups in manifest.json are malformed: {}", dir, m.tag,
         e.what());
  }
  return out;
}

// The saved buffers are the model's persistent buffers, by name and shape (a dtype
// that differs is converted, as load_state_dict does). Checkpoints from before buffers
// were saved leave the model's alone; so does a non-strict load for the ones one side lacks.
void Checkpointer::check_buffers(const CheckpointSource& reader, const std::string& dir,
                                 bool strict) const {
  const Manifest& m = reader.manifest();
  if (!m.has_buffers) return;
  std::unordered_set<std::string> saved;
  for (const auto& b : m.buffers) {
    saved.insert(b.name);
    const NamedBuffer* mine = p_.buffers.find(b.name);
    if (mine == nullptr || !mine->persistent) {
      if (!strict || reader.holds_other_stages()) continue;
      fail(
          "checkpoint '{}/{}' has buffer '{}', which the model does not have (non-strict "
          "loading skips it: load_module_strict=False)",
          dir, m.tag, b.name);
    }
    if (mine->tensor.sizes().vec() != b.shape) {
      fail("checkpoint '{}/{}': buffer '{}' has shape [{}] there and [{}] in the model", dir, m.tag,
           b.name, fmt::join(b.shape, ", "), fmt::join(mine->tensor.sizes(), ", "));
    }
  }
  for (const auto& b : p_.buffers.all()) {
    if (strict && b.persistent && !saved.count(b.name)) {
      fail(
          "checkpoint '{}/{}' has no buffer '{}' (the model has it): a different model? "
          "(non-strict loading keeps the model's: load_module_strict=False)",
          dir, m.tag, b.name);
    }
  }
}

void Checkpointer::load_buffers(const CheckpointSource& reader) {
  for (const auto& saved : reader.manifest().buffers) {
    const NamedBuffer* mine = p_.buffers.find(saved.name);
    if (mine == nullptr || !mine->persistent) continue;  // a non-strict load's: checked
    at::Tensor bytes = at::empty({saved.bytes}, at::kByte);
    reader.read_buffer(saved, bytes.data_ptr());
    ModuleBuffers::assign(mine->tensor, bytes, torch_dtype(saved.dtype));
  }
}

void Checkpointer::check_layout(const CheckpointSource& reader, const std::string& dir,
                                const LoadOptions& options) const {
  check_buffers(reader, dir, options.strict);
  if (options.optimizer_states && !options.module_only) {
    check_state_names(reader.manifest().optimizer_state, p_.pipeline.optimizer().state_names(),
                      p_.plan.settings.optimizer.type.c_str());
  }
  check_params(reader, dir, options);
}

// Parameters by name and shape. A non-strict load skips what the model lacks and keeps
// the model's values where the checkpoint lacks one (saved with frozen parameters left
// out, say), except for a parameter whose optimizer state it would load.
void Checkpointer::check_params(const CheckpointSource& reader, const std::string& dir,
                                const LoadOptions& options) const {
  const std::string& tag = reader.manifest().tag;
  const bool with_optimizer = options.optimizer_states && !options.module_only;
  std::unordered_set<std::string> mine;
  for (const auto& record : p_.groups) {
    for (const auto& slot : record.flat->slots()) {
      // Split experts: this rank's under the name it is saved by, the other ep
      // coordinates' as the model's too (their ranks load them).
      SavedParam s{saved_name(record, slot.name),
                   saved_shape(record, slot),
                   slot.offset,
                   slot.numel,
                   -1,
                   {},
                   0};
      mine.insert(s.name);
      const auto renamed = p_.expert_names.renamed.find(slot.name);
      if (experts_split(record) && renamed != p_.expert_names.renamed.end()) {
        for (const auto& other : renamed->second) mine.insert(other);
      }
      if (!reader.has_param(s.name)) {
        if (!options.strict && !(record.trainable && with_optimizer)) continue;
        fail(
            "checkpoint '{}/{}' has no parameter '{}' (the model has it): a different model, "
            "or saved with exclude_frozen_parameters=True? {}",
            dir, tag, s.name,
            options.strict ? "load_module_strict=False keeps the model's values for what the "
                             "checkpoint lacks"
                           : "it trains, so its optimizer state is missing too: pass "
                             "load_optimizer_states=False to load the parameters alone");
      }
      const SavedParam& p = reader.param(s.name);
      if (p.shape != s.shape) {
        fail("checkpoint '{}/{}': parameter '{}' has shape [{}] there and [{}] in the model", dir,
             tag, s.name, fmt::join(p.shape, ", "), fmt::join(s.shape, ", "));
      }
    }
  }
  if (!options.strict || reader.holds_other_stages()) return;
  for (const auto& g : reader.manifest().groups) {
    for (const auto& p : g.params) {
      if (!mine.count(p.name)) {
        fail(
            "checkpoint '{}/{}' has parameter '{}', which the model does not have (non-strict "
            "loading skips it: load_module_strict=False)",
            dir, tag, p.name);
      }
    }
  }
}

// Fills `out` (count elements: group `g`'s flat buffer from `begin`) from the saved
// parameters' array `array`; padding and what the checkpoint lacks (a non-strict load's,
// checked) keep what `out` holds.
void Checkpointer::read_range(const CheckpointSource& reader, const GroupRecord& record, int array,
                              int64_t begin, int64_t count, float* out) const {
  for (const auto& s : record.flat->slots()) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(begin + count, s.offset + s.numel);
    const std::string& name = saved_name(record, s.name);
    if (lo >= hi || !reader.has_param(name)) continue;
    size_t saved_group = 0;
    reader.param(name, &saved_group);
    const bool saved_trainable = reader.manifest().groups[saved_group].trainable;
    if (array > 0 && !saved_trainable) continue;  // frozen when saved: no Adam state
    reader.read(name, array, saved_offset(record, s) + lo - s.offset, hi - lo, out + (lo - begin));
  }
}

// A trainable group whole: its fp32 master and the optimizer's state arrays.
void Checkpointer::load_group(const CheckpointSource& reader, GroupId i) {
  const GroupRecord& record = p_.groups[i];
  FlatParamGroup* g = record.flat.get();
  const int64_t S = g->shard_numel();
  const int u = record.coordinator_unit_index();
  const size_t t = record.trainable->value;
  const int64_t n = p_.pipeline.optimizer().group_numel(t);
  const int64_t begin = n == S ? slice_rank(record) * S : 0;
  const std::vector<std::string>& names = reader.manifest().optimizer_state;
  std::vector<std::vector<float>> arrays(1 + names.size(), std::vector<float>(n, 0.0f));
  std::vector<const float*> data;
  for (size_t a = 0; a < arrays.size(); ++a) {
    read_range(reader, record, static_cast<int>(a), begin, n, arrays[a].data());
    data.push_back(arrays[a].data());
  }
  {
    ShardUpdate update(p_.param_home, u);
    p_.pipeline.optimizer().write_state(t, names, data);
  }
  if (g->sharded() && g->gathered() && u >= 0) p_.units->coordinator().release_now(u);
}

// A copy of what this rank holds of a group's parameters, as fp32 on the host: its
// shard, or the whole group where it is not sharded (a copy even where they are host
// fp32 already: it is filled before the group is written).
at::Tensor Checkpointer::current_values(const GroupRecord& record) const {
  const auto host_copy = [](const at::Tensor& t) {
    return t.to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  };
  FlatParamGroup* g = record.flat.get();
  if (!g->sharded()) return host_copy(g->flat());
  const int u = record.coordinator_unit_index();
  if (p_.param_home && u >= 0 && p_.param_home->holds(u)) {
    at::Tensor values = at::empty({g->shard_numel()}, g->flat().options());
    p_.param_home->fill(u, values);
    return host_copy(values);
  }
  return host_copy(g->param_shard());
}

void Checkpointer::load_group_values(const CheckpointSource& reader, GroupId i) {
  const GroupRecord& record = p_.groups[i];
  FlatParamGroup* g = record.flat.get();
  const int64_t S = g->shard_numel();
  const int u = record.coordinator_unit_index();
  const int64_t begin = g->sharded() ? slice_rank(record) * S : 0;
  const int64_t n = g->sharded() ? S : g->padded_numel();
  bool whole = true;  // every parameter of the group is in the checkpoint
  for (const auto& s : g->slots()) whole = whole && reader.has_param(saved_name(record, s.name));
  at::Tensor src = whole ? at::zeros({n}, at::kFloat) : current_values(record);
  read_range(reader, record, 0, begin, n, src.data_ptr<float>());
  {
    ShardUpdate update(p_.param_home, u);
    if (!g->sharded()) {
      g->flat().copy_(src);
    } else {
      g->settle_shard_read();  // a gather's copy of it to the GPU may still be reading it
      g->param_shard().copy_(src);
    }
    if (record.trainable) p_.pipeline.optimizer().reload_master(record.trainable->value);
  }
  if (g->sharded() && g->gathered() && u >= 0) p_.units->coordinator().release_now(u);
}

}  // namespace zeroshard
