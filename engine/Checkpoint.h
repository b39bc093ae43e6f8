#pragma once
// The on-disk format of a sharded checkpoint, and the pieces that read and write it
// safely. A checkpoint DIR/TAG holds one file per rank (rankR.bin: for each group, this
// rank's slice [R*S, (R+1)*S) of the padded flat buffer: fp32 master and the optimizer's
// state arrays (Adam's m and v, or a torch.optim class's, named in the manifest) for
// trainable groups, the parameters for frozen ones; then its RNG state; rank0.bin then
// the model's persistent buffers, the same on every rank, once) and
// manifest.json (rank 0): format, config, world size, stage, step, loss scale, client
// state, every group's parameters (name, shape, offset) and each file's size and CRC-32.
// With shard groups (mics_shard_size) there is one file per shard, written by the
// first group's ranks, and world size counts shards.
// With tensor parallelism (engine/ParallelDims.h) DIR/TAG holds one such checkpoint per tp
// coordinate, DIR/TAG/tp_rank_XX (DeepSpeed's mp_rank_XX, as folders), each saved by that
// coordinate's data-parallel ranks, and DIR/TAG/tensor_parallel.json says how many; each
// split parameter's entry names the dimension it was cut along, so the parts load at
// another tp size (engine/ReslicedCheckpoint.h) and consolidate into whole parameters.
// With experts split over expert-parallel ranks each rank file holds its own experts'
// slices, and the manifest lists each expert group once per ep coordinate
// (SavedGroup::ranks), its parameters under their names with every expert on every rank;
// fused experts (a Hugging Face model's, stacked along dim 0) as parts of the whole
// parameter (SavedParam::whole_shape), which the reader joins.
// DIR/latest names the newest complete tag. Because every element is addressed by
// parameter name and offset, a checkpoint loads into any world size and stage: the
// reader re-slices on load.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "zeroshard/Types.h"

namespace zeroshard {

constexpr int kCheckpointFormat = 1;

// A parameter group's options as the manifest keeps them: the ones set (unset ones
// follow the config).
nlohmann::json param_group_json(const ParamGroupOptions& options);
ParamGroupOptions param_group_from_json(const nlohmann::json& j);

struct SavedParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in the group's flat buffer
  int64_t numel = 0;
  // The dimension this tp coordinate's slice was cut along (NamedParam's); -1: whole.
  int tensor_parallel_dim = -1;
  // A part of a parameter saved in parts (fused experts split over expert-parallel ranks,
  // each ep coordinate's rows of the experts stacked along dim 0): the whole parameter's
  // shape and where this part starts in it, in elements. Empty: the parameter is whole.
  std::vector<int64_t> whole_shape;
  int64_t whole_offset = 0;
  bool part() const { return !whole_shape.empty(); }
};

struct SavedGroup {
  int64_t shard_numel = 0;  // S: each rank's slice of the padded flat buffer
  bool trainable = true;
  std::string dtype;        // of the parameters (frozen groups store them)
  int64_t file_offset = 0;  // where the group's arrays start in each rank file
  std::vector<SavedParam> params;
  // fp32 arrays of a trainable group: the master and the optimizer's state arrays
  // (Manifest::optimizer_state).
  int arrays = 3;
  // The rank files holding its slices, in slice order; empty: every rank's, in rank order.
  // A group of experts split over expert-parallel ranks is saved once per ep coordinate,
  // each copy at the same file offset in the files of that coordinate's ranks, its
  // parameters under the names the experts have with every expert on every rank.
  std::vector<int> ranks;
  int64_t slices(int world_size) const {
    return ranks.empty() ? world_size : static_cast<int64_t>(ranks.size());
  }
  // Bytes of the group's arrays in a rank file: `arrays` fp32 arrays, or one in `dtype`.
  int64_t bytes() const;
};

// A module buffer in rank0.bin (engine/ModuleBuffers.h): its bytes as the tensor holds
// them, dtype by torch's own name.
struct SavedBuffer {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in rank0.bin
  int64_t bytes = 0;
};

// Torch's name of a dtype ("float32", "int64", "bool", ...), as Python's getattr(torch,
// name) reads it back, and the reverse; errors name what is allowed.
std::string torch_dtype_name(c10::ScalarType type);
c10::ScalarType torch_dtype(const std::string& name);

struct SavedFile {
  std::string name;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct Manifest {
  int format = kCheckpointFormat;
  std::string tag;
  int world_size = 1;
  int stage = 0;
  int64_t optimizer_steps = 0;
  // The engine's step count and the config scheduler's position (StepPipeline): the
  // optimizer's count unless a load without its state set them apart.
  int64_t global_steps = 0, schedule_steps = 0;
  int64_t skipped_steps = 0;  // windows an fp16 overflow dropped
  int64_t micro_steps = 0;
  nlohmann::json loss_scale;  // null without fp16
  nlohmann::json client_state;
  // The optimizer's parameter groups as set when saved (each group's lr, beta1, beta2,
  // eps, weight_decay, decoupled where set), and the state of a client LR scheduler
  // (its state_dict, given by the Python package): null in checkpoints without them.
  nlohmann::json param_groups;
  nlohmann::json lr_scheduler;
  // The optimizer's per-element state arrays after the master, by torch.optim's names
  // (absent in older checkpoints: Adam's), and its other state (ShardOptimizer's
  // scalar_state, null for the built-in Adam).
  std::vector<std::string> optimizer_state{"exp_avg", "exp_avg_sq"};
  nlohmann::json optimizer_scalars;
  std::string config_yaml;
  int64_t rng_offset = 0, rng_bytes = 0;  // in each rank file (engine/RngStates.h)
  int64_t device_rng_bytes = 0;           // the training device's part, at its end
  std::vector<SavedGroup> groups;
  // In rank0.bin after its RNG state. has_buffers is false for checkpoints written
  // before buffers were saved: loading them leaves the model's buffers as they are.
  bool has_buffers = false;
  std::vector<SavedBuffer> buffers;
  int64_t buffer_bytes() const;
  std::vector<SavedFile> files;
  // Tied parameters: (another name, the saved name it shares storage with).
  std::vector<std::pair<std::string, std::string>> aliases;

  nlohmann::json to_json() const;
  static Manifest from_json(const nlohmann::json& j, const std::string& origin);
};

// Reads DIR/TAG/manifest.json (TAG empty: the one DIR/latest names) and checks that
// every rank file is there, whole, and matches its checksum. Errors name the file.
Manifest read_manifest(const std::string& dir, std::string tag);
// The folder inside DIR/TAG that holds tp coordinate `coordinate`'s part: "tp_rank_01".
std::string tensor_parallel_part(int coordinate);
// The folder inside DIR/TAG that holds pipeline stage `stage`'s part: "pipeline_stage_01";
// DIR/TAG/pipeline.json says how many stages saved.
std::string pipeline_stage_part(int stage);
// The tag DIR/latest names; fails naming DIR where there is none.
std::string latest_tag(const std::string& dir);

uint32_t file_crc32(const std::string& path);

// Bytes of an element of a saved group's dtype ("fp32", "bf16", "fp16"); fails naming
// what is allowed.
int64_t saved_element_size(const std::string& dtype);
// Elements of a saved shape, or -1 where a dimension is negative or the count is past
// anything a file could hold.
int64_t saved_numel(const std::vector<int64_t>& shape);

}  // namespace zeroshard
