// Checkpointer::save / load_checkpoint (the format: engine/Checkpoint.h).
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>

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
#include "engine/RngStates.h"
#include "engine/StepPipeline.h"
#include "engine/UnitSchedule.h"
#include "offload/SwapFile.h"
#include "optim/ShardOptimizer.h"
#include "plan/Planner.h"
#include "sharding/Collectives.h"
#include "sharding/FlatParamGroup.h"
#include "sharding/GradReducer.h"
#include "sharding/LossScaler.h"
#include "sharding/ParamCoordinator.h"

namespace zeroshard {
namespace {

std::string dtype_name(at::ScalarType t) {
  if (t == at::kBFloat16) return "bf16";
  if (t == at::kHalf) return "fp16";
  return "fp32";
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    fail("checkpoint: cannot create '{}': {}", path, std::strerror(errno));
  }
}

// PATH and the folders above it that are missing (DIR/TAG/pipeline_stage_XX/tp_rank_YY).
void make_dirs(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    make_dir(path.substr(0, slash));
  }
  make_dir(path);
}

}  // namespace

void refuse_quantized(const TrainingSettings& s, const char* what) {
  if (s.weight_quantization.bits == 0) return;  // the same on every rank: the config says it
  fail(
      "checkpoint {}: the weights are kept quantized (weight_quantization."
      "quantized_initialization.num_bits {}), and a checkpoint holds full-precision shards; "
      "allowed: an engine without weight_quantization ({})",
      what, s.weight_quantization.bits,
      std::string(what) == "save" ? "or save_16bit_model / save_pretrained: the weights dequantized"
                                  : "quantizing as it loads is not supported");
}

int Checkpointer::rank() const {
  return p_.dist.dims.coordinate(Dim::Dp);
}

int Checkpointer::shard_rank() const {
  return p_.dist.shard_rank();
}

int Checkpointer::shard_count() const {
  return p_.dist.shard_size();
}

bool Checkpointer::experts_split(const GroupRecord& record) const {
  return record.expert && p_.dist.dims.size(Dim::Ep) > 1;
}

int Checkpointer::slice_rank(const GroupRecord& record) const {
  return experts_split(record) ? p_.dist.shard_rank(true) : shard_rank();
}

void Checkpointer::check_expert_names(const char* doing) const {
  const int ep = p_.dist.dims.size(Dim::Ep);
  for (const GroupRecord& record : p_.groups) {
    if (!experts_split(record)) continue;
    for (const auto& s : record.flat->slots()) {
      if (stacked(record, s.name)) {
        if (!s.shape.empty()) continue;
      } else {
        const auto it = p_.expert_names.renamed.find(s.name);
        if (it != p_.expert_names.renamed.end() && static_cast<int>(it->second.size()) == ep)
          continue;
      }
      fail(
          "{} with expert parallelism (ep_size {}): the expert parameter '{}' has no name "
          "with every expert on every rank to be saved under; allowed: DeepSpeed's MoE layer "
          "(zeroshard.moe.layer.MoE), a Hugging Face model's fused experts split by "
          "expert_parallel (AutoEP), or ep_size 1",
          doing, ep, s.name);
    }
  }
}

bool Checkpointer::stacked(const GroupRecord& record, const std::string& name) const {
  return experts_split(record) && p_.expert_names.stacked.count(name) != 0;
}

const std::string& Checkpointer::saved_name(const GroupRecord& record,
                                            const std::string& name) const {
  if (!experts_split(record) || stacked(record, name)) return name;
  return p_.expert_names.renamed.at(name).at(static_cast<size_t>(p_.dist.dims.coordinate(Dim::Ep)));
}

int64_t Checkpointer::saved_offset(const GroupRecord& record, const ParamSlot& slot) const {
  return stacked(record, slot.name) ? p_.dist.dims.coordinate(Dim::Ep) * slot.numel : 0;
}

std::vector<int64_t> Checkpointer::saved_shape(const GroupRecord& record,
                                               const ParamSlot& slot) const {
  std::vector<int64_t> shape = slot.shape;
  if (stacked(record, slot.name)) shape[0] *= p_.dist.dims.size(Dim::Ep);
  return shape;
}

bool Checkpointer::saved(const GroupRecord& record, const SaveOptions& options) const {
  return options.frozen_parameters || record.trainable.has_value();
}

Manifest Checkpointer::layout(const SaveOptions& options) const {
  Manifest m;
  // One file per shard: with shard groups (mics_shard_size) the first group writes them,
  // the others hold the same shards.
  m.world_size = shard_count();
  m.stage = p_.plan.settings.stage.number();
  m.optimizer_steps = p_.pipeline.optimizer().steps();
  m.global_steps = p_.pipeline.global_steps();
  m.schedule_steps = p_.pipeline.schedule_steps();
  m.skipped_steps = p_.pipeline.skipped_steps();
  m.micro_steps = p_.pipeline.micro_steps();
  m.config_yaml = emit_config_yaml(p_.plan.config);
  m.optimizer_state = p_.pipeline.optimizer().state_names();
  m.optimizer_scalars = nlohmann::json::parse(p_.pipeline.optimizer().scalar_state());
  const std::unordered_map<std::string, int> split_dims = p_.groups.tensor_parallel_dims();
  int64_t offset = 0;
  for (const GroupRecord& record : p_.groups) {
    if (!saved(record, options)) continue;
    const auto& g = record.flat;
    SavedGroup sg;
    sg.shard_numel = g->shard_numel();
    sg.trainable = record.trainable.has_value();
    sg.dtype = dtype_name(g->flat().scalar_type());
    sg.file_offset = offset;
    sg.arrays = 1 + static_cast<int>(m.optimizer_state.size());
    for (const auto& s : g->slots()) {
      const auto split = split_dims.find(s.name);
      sg.params.push_back({s.name,
                           s.shape,
                           s.offset,
                           s.numel,
                           split == split_dims.end() ? -1 : split->second,
                           {},
                           0});
    }
    offset += sg.bytes();
    if (!experts_split(record)) {
      m.groups.push_back(std::move(sg));
      continue;
    }
    // One copy per ep coordinate, in the files of its edp ranks (dp = edp x ep + ep
    // coordinate), each parameter under that coordinate's name.
    const ParallelDims& d = p_.dist.dims;
    const int ep = d.size(Dim::Ep), edp = d.size(Dim::Edp);
    for (int c = 0; c < ep; ++c) {
      SavedGroup copy = sg;
      for (int e = 0; e < edp; ++e) copy.ranks.push_back(e * ep + c);
      for (auto& param : copy.params) {
        if (p_.expert_names.stacked.count(param.name)) {  // rows [c x n, (c+1) x n) of the whole
          param.whole_shape = param.shape;
          param.whole_shape[0] *= ep;
          param.whole_offset = c * param.numel;
        } else {
          param.name = p_.expert_names.renamed.at(param.name).at(static_cast<size_t>(c));
        }
      }
      m.groups.push_back(std::move(copy));
    }
  }
  m.aliases = p_.groups.aliases();
  m.rng_offset = offset;
  const RngStates rng = rng_states_of(p_.device);
  m.rng_bytes = static_cast<int64_t>(rng.bytes.size());
  m.device_rng_bytes = rng.device_bytes;
  m.has_buffers = true;
  int64_t pos = m.rng_offset + m.rng_bytes;
  for (const auto& b : p_.buffers.all()) {
    if (!b.persistent) continue;
    const int64_t bytes = b.tensor.numel() * static_cast<int64_t>(b.tensor.element_size());
    m.buffers.push_back(
        {b.name, torch_dtype_name(b.tensor.scalar_type()), b.tensor.sizes().vec(), pos, bytes});
    pos += bytes;
  }
  if (const LossScaler* scaler = p_.pipeline.scaler()) {
    const auto s = scaler->state();
    m.loss_scale = {{"scale", s.scale},
                    {"hysteresis_left", s.hysteresis_left},
                    {"iteration", s.iteration},
                    {"last_overflow", s.last_overflow}};
  }
  return m;
}

std::string Checkpointer::save(const std::string& dir, std::string tag,
                               const std::string& client_state_json,
                               const std::string& lr_scheduler_json, const SaveOptions& options) {
  if (tag.empty()) tag = fmt::format("global_step{}", p_.pipeline.global_steps());
  if (tag.find('/') != std::string::npos || tag == "latest" || tag[0] == '.') {
    fail("checkpoint tag '{}' is not allowed; allowed: a plain name (no '/', not 'latest')", tag);
  }
  const ParallelDims& d = p_.dist.dims;
  refuse_quantized(p_.plan.settings, "save");
  check_expert_names("save_checkpoint");
  const bool stages = d.size(Dim::Pp) > 1, tp = d.size(Dim::Tp) > 1;
  if (!stages && !tp) return save_part(dir, tag, client_state_json, lr_scheduler_json, options);
  // DIR/TAG/pipeline_stage_XX, DIR/TAG/tp_rank_YY, or both: DIR/TAG/pipeline_stage_XX/tp_rank_YY.
  const std::string whole = dir + "/" + tag;
  std::string failure;
  try {  // save_part makes the folders where its ranks agree on a failure to
    SaveOptions part = options;
    part.latest = false;
    const std::string stage = pipeline_stage_part(d.coordinate(Dim::Pp));
    if (stages && tp) {
      save_part(whole + "/" + stage, tensor_parallel_part(d.coordinate(Dim::Tp)), client_state_json,
                lr_scheduler_json, part);
    } else {
      save_part(whole, stages ? stage : tensor_parallel_part(d.coordinate(Dim::Tp)),
                client_state_json, lr_scheduler_json, part);
    }
  } catch (const Error& e) {
    failure = e.what();  // the other parts hear of it in publish_parts
  }
  publish_parts(dir, tag, failure, options.latest);
  return tag;
}

// Each data-parallel group has agreed on its own part (publish); the groups across the
// parts now agree on all of them: with pipeline stages and tensor parallelism, first each
// stage's tp parts (its tp rank 0 of data-parallel rank 0 writes the stage's
// tensor_parallel.json), then the stages; otherwise the one level there is. Rank 0 writes
// tensor_parallel.json or pipeline.json at the top and moves `latest`. A failure is
// carried up the levels, never thrown between them: every rank reaches each agreement.
void Checkpointer::publish_parts(const std::string& dir, const std::string& tag,
                                 const std::string& failure_here, bool move_latest) {
  const ParallelDims& d = p_.dist.dims;
  const bool stages = d.size(Dim::Pp) > 1;
  std::string failure = failure_here;
  if (stages && d.size(Dim::Tp) > 1) {
    const PartsLevel tp_parts{
        p_.comms.tensor_parallel(),
        dir + "/" + tag + "/" + pipeline_stage_part(d.coordinate(Dim::Pp)), "tensor_parallel.json",
        d.coordinate(Dim::Tp) == 0 && d.coordinate(Dim::Dp) == 0, "tensor-parallel rank"};
    failure = publish_level(tag, tp_parts, failure, "");
  }
  const PartsLevel top{stages ? p_.comms.pipeline_parallel() : p_.comms.tensor_parallel(),
                       dir + "/" + tag,
                       stages ? "pipeline.json" : "tensor_parallel.json",
                       p_.dist.env.rank == 0,
                       stages ? "pipeline stage" : "tensor-parallel rank",
                       stages ? p_.comms.tensor_parallel() : nullptr};
  failure = publish_level(tag, top, failure, move_latest ? dir : "");
  if (!failure.empty()) throw Error(failure);
}

std::string Checkpointer::publish_level(const std::string& tag, const PartsLevel& level,
                                        const std::string& failure_here,
                                        const std::string& latest_dir) {
  const ParallelDims& d = p_.dist.dims;
  at::Tensor failed = at::full({1}, failure_here.empty() ? 0 : 1, at::kLong);
  agree(tag, [&] { level.across->all_reduce_sum(failed).wait(); });
  if (!failure_here.empty()) return failure_here;
  if (failed.item<int64_t>() > 0) {
    return fmt::format(
        "rank {}: saving checkpoint '{}' failed on another {} (its message says why); the "
        "previous checkpoint stays the latest",
        p_.dist.env.rank, tag, level.part_name);
  }
  at::Tensor published = at::zeros({1}, at::kLong);
  std::string failure;
  if (level.writes) {
    try {
      const nlohmann::json about = {
          {"tp_size", d.size(Dim::Tp)}, {"dp_size", d.size(Dim::Dp)}, {"pp_size", d.size(Dim::Pp)}};
      write_file_atomically(level.folder + "/" + level.about_file, about.dump(1), "checkpoint");
      if (!latest_dir.empty())
        write_file_atomically(latest_dir + "/latest", tag + "\n", "checkpoint");
      published.fill_(1);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  agree(tag, [&] {
    level.across->all_reduce_sum(published).wait();
    p_.comms.data_parallel().all_reduce_sum(published).wait();
    if (level.then) level.then->all_reduce_sum(published).wait();
  });
  if (!failure.empty())
    return fmt::format("rank {}: saving checkpoint '{}' failed: {}", p_.dist.env.rank, tag,
                       failure);
  if (published.item<int64_t>() == 0) {
    return fmt::format(
        "rank {}: saving checkpoint '{}' failed: the rank that writes {} could not (its message "
        "says why); the previous checkpoint stays the latest",
        p_.dist.env.rank, tag, level.about_file);
  }
  return "";
}

std::string Checkpointer::save_part(const std::string& dir, const std::string& tag,
                                    const std::string& client_state_json,
                                    const std::string& lr_scheduler_json,
                                    const SaveOptions& options) {
  fault_point("save.begin");
  Manifest m = layout(options);
  m.tag = tag;
  m.param_groups = nlohmann::json::array();
  for (size_t g = 0; g < p_.param_groups.size(); ++g) {
    m.param_groups.push_back(param_group_json(p_.param_groups.options(g)));
  }
  // Whatever fails on this rank alone is told to the others in publish, which every rank
  // reaches: none is left waiting there.
  std::string failure;
  try {
    try {
      m.client_state = nlohmann::json::parse(client_state_json.empty() ? "{}" : client_state_json);
    } catch (const nlohmann::json::exception& e) {
      fail("client_state is not plain data (JSON): {}", e.what());
    }
    try {
      if (!lr_scheduler_json.empty()) m.lr_scheduler = nlohmann::json::parse(lr_scheduler_json);
    } catch (const nlohmann::json::exception& e) {
      fail("lr_scheduler state is not plain data (JSON): {}", e.what());
    }
    const std::string folder = dir + "/" + tag;
    make_dirs(folder);
    if (rank() < shard_count()) write_rank_file(folder, options);
  } catch (const Error& e) {
    failure = e.what();
  }
  publish(dir, m, failure, options.latest);
  return tag;
}

void Checkpointer::write_rank_file(const std::string& folder, const SaveOptions& options) {
  const std::string file = folder + fmt::format("/rank{}.bin", rank());
  FileWriter out(file + ".tmp", "checkpoint");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < p_.groups.size(); ++i) {
    if (!saved(p_.groups[GroupId(i)], options)) continue;
    write_group_slice(GroupId(i), [&](const void* data, int64_t bytes) { out.write(data, bytes); });
    fault_point("save.rank_file");
  }
  const RngStates rng = rng_states_of(p_.device);
  out.write(rng.bytes.data(), static_cast<int64_t>(rng.bytes.size()));
  if (rank() == 0) {  // rank 0's buffers, the ones every rank gets before a forward
    for (const auto& b : p_.buffers.all()) {
      if (!b.persistent) continue;
      const at::Tensor bytes = ModuleBuffers::host_bytes(b.tensor);
      out.write(bytes.data_ptr(), bytes.numel());
    }
  }
  out.finish();
  publish_file(file + ".tmp", file, "checkpoint");
}

// A collective, not a store wait: a peer that died fails it at once (its sockets close)
// instead of after the whole timeout.
void Checkpointer::agree(const std::string& tag, const std::function<void()>& collective) {
  try {
    collective();
  } catch (const Error& e) {
    fail("rank {}: saving checkpoint '{}' failed: {}; the previous checkpoint stays the latest",
         rank(), tag, e.what());
  }
}

void Checkpointer::publish(const std::string& dir, Manifest& m, const std::string& failure_here,
                           bool move_latest) {
  // Every rank's file is complete before the manifest names it, and `latest` moves only
  // after the manifest: a crash at any point leaves the previous tag loadable.
  const std::string folder = dir + "/" + m.tag;
  const std::string mine = fmt::format("rank{}.bin", rank());
  at::Tensor files =
      at::zeros({p_.dist.dims.size(Dim::Dp), 3}, at::kLong);  // (written, crc, bytes)
  if (failure_here.empty() && rank() < m.world_size) {
    struct stat st {};
    ::stat((folder + "/" + mine).c_str(), &st);
    files[rank()][0] = 1;
    files[rank()][1] = static_cast<int64_t>(file_crc32(folder + "/" + mine));
    files[rank()][2] = static_cast<int64_t>(st.st_size);
  }
  fault_point("save.publish");
  agree(m.tag, [&] { p_.comms.data_parallel().all_gather(files.view({-1})).wait(); });
  if (!failure_here.empty()) {
    fail("rank {}: saving checkpoint '{}' failed: {}; the previous checkpoint stays the latest",
         rank(), m.tag, failure_here);
  }
  std::vector<int> unwritten;
  for (int r = 0; r < m.world_size; ++r)
    if (files[r][0].item<int64_t>() == 0) unwritten.push_back(r);
  if (!unwritten.empty()) {
    fail(
        "rank {}: saving checkpoint '{}' failed: rank(s) {} could not write their file (their "
        "messages say why); the previous checkpoint stays the latest",
        rank(), m.tag, fmt::join(unwritten, ", "));
  }
  at::Tensor published = at::zeros({1}, at::kLong);
  std::string failure;
  if (rank() == 0) {
    for (int r = 0; r < m.world_size; ++r) {
      SavedFile f;
      f.name = fmt::format("rank{}.bin", r);
      f.crc32 = static_cast<uint32_t>(files[r][1].item<int64_t>());
      f.bytes = files[r][2].item<int64_t>();
      m.files.push_back(f);
    }
    try {
      fault_point("save.manifest");
      write_file_atomically(folder + "/manifest.json", m.to_json().dump(1), "checkpoint");
      fault_point("save.latest");
      if (move_latest) write_file_atomically(dir + "/latest", m.tag + "\n", "checkpoint");
      published.fill_(1);
    } catch (const Error& e) {
      failure = e.what();  // told to the other ranks before it is raised here
    }
  }
  agree(m.tag, [&] { p_.comms.data_parallel().broadcast(published, 0).wait(); });
  if (!failure.empty()) fail("rank 0: saving checkpoint '{}' failed: {}", m.tag, failure);
  if (published.item<int64_t>() == 0) {
    fail(
        "rank {}: saving checkpoint '{}' failed: rank 0 could not write its manifest (its "
        "message says why); the previous checkpoint stays the latest",
        rank(), m.tag);
  }
}

// This rank's slice [r*S, (r+1)*S) of group `i`: fp32 master and the optimizer's state
// arrays if trainable, the parameters otherwise. Offloaded state is streamed from its
// tier one group at a time.
void Checkpointer::write_group_slice(GroupId i,
                                     const std::function<void(const void*, int64_t)>& write) {
  const GroupRecord& record = p_.groups[i];
  FlatParamGroup* g = record.flat.get();
  const int64_t S = g->shard_numel();
  if (record.trainable) {
    const size_t t = record.trainable->value;
    const int64_t n = p_.pipeline.optimizer().group_numel(t);
    const size_t count = 1 + p_.pipeline.optimizer().state_names().size();
    std::vector<std::vector<float>> arrays(count, std::vector<float>(n));
    std::vector<float*> data;
    for (auto& a : arrays) data.push_back(a.data());
    p_.pipeline.optimizer().read_state(t, data);
    // stage 0: the optimizer holds it all
    const int64_t from = n == S ? 0 : slice_rank(record) * S;
    for (const auto& a : arrays) write(a.data() + from, S * 4);
    return;
  }
  const int u = record.coordinator_unit_index();
  at::Tensor values;
  if (!g->sharded()) {
    values = g->own_slice();
  } else if (p_.param_home && p_.param_home->holds(u)) {
    values = at::empty({S}, g->flat().options());
    p_.param_home->fill(u, values);
  } else {
    values = g->param_shard();
  }
  values = values.to(at::kCPU).contiguous();  // the writer reads host memory
  write(values.data_ptr(), S * static_cast<int64_t>(values.element_size()));
}

}  // namespace zeroshard
