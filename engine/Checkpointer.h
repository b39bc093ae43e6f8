#pragma once
// Saving and loading a sharded checkpoint (the format: engine/Checkpoint.h) from the
// engine's parts. A Checkpointer is made for one save or one load and reads and writes
// the parts it is given; it keeps nothing between calls.
//
// Save: each rank writes its own file, then the ranks agree (collectives, so a dead peer
// fails them at once) before rank 0 writes the manifest and moves `latest`: a crash at any
// point leaves the previous tag loadable. Load: the layout (parameters by name and shape,
// buffers, the optimizer's state names and groups) is checked before anything changes,
// then each group is refilled from the saved slices that overlap this rank's.
#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "engine/Checkpoint.h"
#include "engine/GroupTable.h"
#include "zeroshard/Types.h"

namespace zeroshard {

class Communicators;
class ModuleBuffers;
class ParamGroupTable;
class ParamHome;
class StepPipeline;
class UnitSchedule;
struct DistContext;
struct Plan;

// What a save or a load reads and writes: the engine's, borrowed for the call.
struct CheckpointParts {
  const Plan& plan;
  const DistContext& dist;
  Communicators& comms;
  const GroupTable& groups;
  StepPipeline& pipeline;
  ParamGroupTable& param_groups;
  ModuleBuffers& buffers;
  ParamHome* param_home;  // stage 3 with its shards on the host or NVMe, else null
  UnitSchedule* units;    // stage 3, else null
  c10::Device device;     // the model's: its random stream is saved with the host's
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointParts parts) : p_(parts) {}

  // Writes DIR/TAG (TAG empty: global_stepN) and returns the tag; fails on every rank,
  // naming the cause, if any rank could not write its part.
  std::string save(const std::string& dir, std::string tag, const std::string& client_state_json,
                   const std::string& lr_scheduler_json);
  LoadedCheckpoint load(const std::string& dir, const std::string& tag);

 private:
  int rank() const;
  int shard_rank() const;
  int shard_count() const;

  // Saving.
  Manifest layout() const;
  void write_rank_file(const std::string& folder);
  void write_group_slice(GroupId group, const std::function<void(const void*, int64_t)>& write);
  void publish(const std::string& dir, Manifest& m, const std::string& failure_here);
  void agree(const std::string& tag, const std::function<void()>& collective);

  // Loading.
  void check_layout(const CheckpointReader& reader, const std::string& dir) const;
  void check_buffers(const CheckpointReader& reader, const std::string& dir) const;
  std::vector<ParamGroupOptions> saved_param_groups(const Manifest& m,
                                                    const std::string& dir) const;
  void read_range(const CheckpointReader& reader, const FlatParamGroup& group, int array,
                  int64_t begin, int64_t count, float* out) const;
  void load_group(const CheckpointReader& reader, GroupId group);
  void load_buffers(const CheckpointReader& reader);

  CheckpointParts p_;
};

}  // namespace zeroshard
