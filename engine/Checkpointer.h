#pragma once
// Saving and loading a sharded checkpoint (the format: engine/Checkpoint.h) from the
// engine's parts. A Checkpointer is made for one save or one load and reads and writes
// the parts it is given; it keeps nothing between calls.
//
// Save: each rank writes its own file, then the ranks agree (collectives, so a dead peer
// fails them at once) before rank 0 writes the manifest and moves `latest`: a crash at any
// point leaves the previous tag loadable. Load: the layout (parameters by name and shape,
// buffers, the optimizer's state names and groups) is checked before anything changes,
// then each group is refilled from the saved slices that overlap this rank's: whole (the
// fp32 master and the optimizer's state), or its parameters alone where LoadOptions
// leave the optimizer's state as it is. Saving is Checkpointer.cpp, loading
// CheckpointLoad.cpp.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <c10/core/Device.h>

#include "engine/Checkpoint.h"
#include "engine/CheckpointReader.h"
#include "engine/GroupTable.h"
#include "engine/ParallelDims.h"
#include "plan/TrainingSettings.h"
#include "zeroshard/Types.h"

namespace zeroshard {

class Collectives;
class Communicators;
class ModuleBuffers;
class ParamGroupTable;
class ParamHome;
class StepPipeline;
class UnitSchedule;
struct ParamSlot;
struct DistContext;
struct Plan;

// How expert parameters split over expert-parallel ranks are saved and loaded, so that a
// checkpoint loads at any ep size: as the model with every expert on every rank has them.
struct ExpertNames {
  // DeepSpeed's MoE layer: per parameter, its name on each ep coordinate's ranks
  // (deepspeed_experts.<i> of coordinate c is expert c x n + i of n local ones).
  std::unordered_map<std::string, std::vector<std::string>> renamed;
  // Fused experts (a Hugging Face model's, stacked along dim 0; the name is the whole's):
  // coordinate c's [n, ...] is rows [c x n, (c+1) x n) of the whole, saved as its part.
  std::unordered_set<std::string> stacked;
  bool empty() const { return renamed.empty() && stacked.empty(); }
};

// What a save or a load reads and writes: the engine's, borrowed for the call.
struct CheckpointParts {
  const Plan& plan;
  const DistContext& dist;
  Communicators& comms;
  const GroupTable& groups;
  StepPipeline& pipeline;
  ParamGroupTable& param_groups;
  ModuleBuffers& buffers;
  ParamHome* param_home;            // stage 3 with its shards on the host or NVMe, else null
  UnitSchedule* units;              // stage 3, else null
  c10::Device device;               // the model's: its random stream is saved with the host's
  const ExpertNames& expert_names;  // empty without expert parallelism
};

// Checkpoints of quantized weights (weight_quantization) are not written: fails, every
// rank alike.
void refuse_quantized(const TrainingSettings& settings, const char* what);

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointParts parts) : p_(parts) {}

  // Writes DIR/TAG (TAG empty: global_stepN) and returns the tag; fails on every rank,
  // naming the cause, if any rank could not write its part.
  std::string save(const std::string& dir, std::string tag, const std::string& client_state_json,
                   const std::string& lr_scheduler_json, const SaveOptions& options = {});
  LoadedCheckpoint load(const std::string& dir, const std::string& tag,
                        const LoadOptions& options = {});

 private:
  int rank() const;  // among the data-parallel ranks, which save and load one checkpoint
  int shard_rank() const;
  int shard_count() const;
  // The slice of `record`'s group this rank writes and reads: its shard rank, its edp rank
  // for experts split over ep ranks.
  int slice_rank(const GroupRecord& record) const;
  // Split experts: every parameter's saved names given (fails naming one without, every
  // rank alike); the name `name` of `record` is saved under, and every ep coordinate's.
  bool experts_split(const GroupRecord& record) const;
  void check_expert_names(const char* doing) const;
  const std::string& saved_name(const GroupRecord& record, const std::string& name) const;
  // Where `slot` of `record` starts in the saved parameter: its rows' first element where
  // it is this coordinate's part of stacked experts, else 0.
  int64_t saved_offset(const GroupRecord& record, const ParamSlot& slot) const;
  // The shape the saved parameter has: the whole's for stacked experts.
  std::vector<int64_t> saved_shape(const GroupRecord& record, const ParamSlot& slot) const;
  bool stacked(const GroupRecord& record, const std::string& name) const;

  // One checkpoint of the data-parallel ranks: the whole of it without tensor parallelism,
  // this tp coordinate's part with it (save and load choose the folder).
  std::string save_part(const std::string& dir, const std::string& tag,
                        const std::string& client_state_json, const std::string& lr_scheduler_json,
                        const SaveOptions& options);
  // `reader` over DIR's saved parameters; `rng`: this rank's saved random streams where
  // as many ranks laid out alike saved it (else each rank keeps its own).
  // DIR/TAG, or this tp coordinate's part of it (resliced from another tp size).
  LoadedCheckpoint load_tensor_parallel(const std::string& dir, const std::string& name,
                                        const LoadOptions& options);
  LoadedCheckpoint load_tensor_parallel(const std::string& dir, const std::string& name,
                                        const LoadOptions& options,
                                        std::vector<std::unique_ptr<CheckpointReader>> parts);
  bool holds_just_this_engines(const CheckpointSource& part) const;
  std::vector<std::unique_ptr<CheckpointReader>> tensor_parallel_parts(
      const std::string& dir, const std::string& name) const;
  std::unique_ptr<CheckpointSource> tensor_parallel_source(const std::string& dir,
                                                           const std::string& name) const;
  LoadedCheckpoint load_part(const CheckpointSource& reader, const std::string& dir,
                             const LoadOptions& options, const std::optional<std::string>& rng);
  // Tensor parallelism or pipeline stages (or both): every part published, then `latest`
  // moved.
  void publish_parts(const std::string& dir, const std::string& tag, const std::string& failure,
                     bool move_latest);
  // One level of parts: `across` holds one rank of each, `writes` says whether this rank
  // writes FOLDER/ABOUT_FILE once all have published; that is told through `across`, the
  // data-parallel group and `then` (null, or the tp group where stages hold tp parts).
  struct PartsLevel {
    Collectives* across;
    std::string folder, about_file;
    bool writes;
    const char* part_name;  // in messages: "pipeline stage"
    Collectives* then = nullptr;
  };
  // The level's agreement; returns this rank's failure or the other parts' (empty: none),
  // for the level above, and moves LATEST_DIR/latest when given.
  std::string publish_level(const std::string& tag, const PartsLevel& level,
                            const std::string& failure_here, const std::string& latest_dir);

  // Saving.
  Manifest layout(const SaveOptions& options) const;
  bool saved(const GroupRecord& record, const SaveOptions& options) const;
  void write_rank_file(const std::string& folder, const SaveOptions& options);
  void write_group_slice(GroupId group, const std::function<void(const void*, int64_t)>& write);
  void publish(const std::string& dir, Manifest& m, const std::string& failure_here,
               bool move_latest);
  void agree(const std::string& tag, const std::function<void()>& collective);

  // Loading.
  void check_layout(const CheckpointSource& reader, const std::string& dir,
                    const LoadOptions& options) const;
  void check_params(const CheckpointSource& reader, const std::string& dir,
                    const LoadOptions& options) const;
  void check_buffers(const CheckpointSource& reader, const std::string& dir, bool strict) const;
  std::vector<ParamGroupOptions> saved_param_groups(const Manifest& m,
                                                    const std::string& dir) const;
  void read_range(const CheckpointSource& reader, const GroupRecord& record, int array,
                  int64_t begin, int64_t count, float* out) const;
  void load_group(const CheckpointSource& reader, GroupId group);
  // The parameters alone: the optimizer, where the group trains, restarts its fp32
  // master from them and keeps its state. Parameters the checkpoint lacks keep their
  // values.
  void load_group_values(const CheckpointSource& reader, GroupId group);
  at::Tensor current_values(const GroupRecord& record) const;
  void load_buffers(const CheckpointSource& reader);

  CheckpointParts p_;
};

}  // namespace zeroshard
