#pragma once
// What stands behind zeroshard::Engine (engine/TrainingEngine.h): the groups, the process
// groups, the optimizer, the coordinator and the offload pieces, defined across
// EngineImpl.cpp, EngineUnits.cpp and EnginePlacement.cpp; checkpoints are a Checkpointer's
// (engine/Checkpointer.h). Only the engine's own files include this header.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/nn/module.h>

#include "common/Error.h"
#include "common/MemoryLedger.h"
#include "engine/Checkpointer.h"
#include "engine/EnginePlan.h"
#include "engine/GroupLayout.h"
#include "engine/GroupTable.h"
#include "engine/ProcessGroupSetup.h"
#include "engine/TrainingEngine.h"

namespace zeroshard {

class Collectives;
class Communicators;
class GradReducer;
class ShardOptimizer;
class ExternalOptimizer;
class SwapSpace;
class ParamHome;
class LossScaler;
class ParamCoordinator;
class SecondaryShards;
class OverlappedStep;
class StepPipeline;
class UnitSchedule;
class OffloadOptimizer;

class EngineImpl {
 public:
  // The public calls, each as TrainingEngine's (engine/TrainingEngine.h), which forwards here.
  EngineImpl(std::shared_ptr<torch::nn::Module> module, const Config& config, EngineOptions options,
             std::optional<LaunchEnv> launch);
  EngineImpl(std::vector<NamedParam> params, std::vector<std::vector<NamedParam>> unit_params,
             const Config& config, std::optional<LaunchEnv> launch,
             std::vector<ParamGroup> param_groups, MaterializeParams materialize,
             std::vector<NamedBuffer> buffers, std::optional<AssumedBatch> batch);
  ~EngineImpl();
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  torch::nn::Module& module() {
    if (!module_) fail("this Engine was built from a parameter list, not a torch::nn::Module");
    return *module_;
  }
  at::Tensor run_unit(const torch::nn::Module& unit, const std::function<at::Tensor()>& forward);
  void unit_forward_begin(size_t unit);
  void unit_forward_end(size_t unit);
  void unit_backward_begin(size_t unit);
  bool unit_inputs_need_grad(size_t unit);
  void unit_inputs_done(size_t unit);
  void model_forward_begin();
  void model_forward_end(bool grad_enabled);
  int touch_unit(size_t unit, bool grad_enabled);
  int unit_held(size_t unit) const;
  void gather_unit(size_t unit);
  void release_unit(size_t unit);
  void commit_parameters(int src_rank);
  void backward(const at::Tensor& loss, bool retain_graph);
  std::vector<NamedParam> full_parameters();
  bool step();
  bool finish_step();
  void zero_grad();

  double loss_scale() const;
  double global_grad_norm() const;
  double lr() const;  // parameter group 0's
  size_t param_group_count() const { return param_groups_.size(); }
  const ParamGroupOptions& param_group(size_t group) const { return param_groups_.options(group); }
  void set_param_group(size_t group, const ParamGroupOptions& options);
  std::vector<AdamHyper> param_group_hypers() const;
  int64_t optimizer_steps() const;
  const Plan& plan() const { return plan_; }
  const Config& config() const { return plan_.config; }
  int rank() const { return dist_.env.rank; }
  int world_size() const { return dist_.env.world_size; }
  // This rank's shard and the number of shards: its place in its shard group
  // (mics_shard_size), or among all ranks without groups.
  int shard_rank() const { return dist_.shard_rank(); }
  int shard_count() const { return dist_.shard_size; }
  MemoryDetail memory_report() const;
  // The model's block shape and the batch it trains on: memory_report's prediction then
  // counts activations (none without it: the engine sees parameters, not their use).
  void set_activation_shape(const ModelSpec& shaped, const TrainingShape& batch) {
    device_.activations = std::make_pair(shaped, batch);
  }
  int64_t bytes_sent() const;
  void barrier();
  MemoryLedger& ledger() { return ledger_; }

  std::string save_checkpoint(const std::string& dir, std::string tag,
                              const std::string& client_state_json,
                              const std::string& lr_scheduler_json, const SaveOptions& options);
  LoadedCheckpoint load_checkpoint(const std::string& dir, const std::string& tag,
                                   const LoadOptions& options);
  void set_aliases(std::vector<std::pair<std::string, std::string>> aliases) {
    groups_.set_aliases(std::move(aliases));
  }

  // Internal from here on: what the public calls above are made of.
  void init(std::vector<NamedParam> params, const std::vector<std::vector<NamedParam>>& unit_params,
            const Config& config, const std::optional<LaunchEnv>& launch,
            std::vector<ParamGroup> param_groups, const MaterializeParams& materialize,
            std::vector<NamedBuffer> buffers, const std::optional<AssumedBatch>& batch = {});
  void add_param_pieces(const FlatParamGroup& g, size_t t, int64_t begin, int64_t count,
                        size_t& trained_params);
  void build_groups(const std::vector<NamedParam>& params,
                    const std::vector<std::vector<NamedParam>>& unit_params,
                    const MaterializeParams& materialize);
  // Stage 3's schedule for `unit` (null at stages 0-2); fails for a unit that does not
  // exist.
  UnitSchedule* schedule_of(size_t unit) const;
  void check_read(size_t trainable_group, size_t slot) const;
  // The parts a Checkpointer (engine/Checkpointer.h) saves and loads.
  CheckpointParts checkpoint_parts();
  // `on_host[i]`: the i-th trainable group's optimizer shard steps on the host (all of
  // them unless offload_optimizer.ratio keeps the first on the device).
  void make_optimizer(bool on_cpu, const std::vector<bool>& on_host);
  std::vector<bool> optimizer_on_host(const std::vector<GroupSpec>& layout) const;
  void make_overlapped_step(int threads);
  // Puts stage 3's shards where the plan says; those on NVMe get the ParamHome returned.
  std::unique_ptr<ParamHome> place_param_shards(const std::vector<FlatParamGroup*>& sharded);
  // Where stage 3's shards on NVMe live (the unit schedule's); null without any.
  ParamHome* param_home() const;
  void broadcast_initial_values(const std::vector<NamedParam>& params);
  ModelSpec spec_of_groups() const;
  // The layers below index trainable groups (the reducer, the optimizer) and coordinator
  // units (ParamHome) by plain integers; these take theirs.
  FlatParamGroup& trainable_group(size_t t) const {
    return groups_.trainable_group(TrainableId(t));
  }
  int unit_of_trainable(size_t t) const {
    return groups_.of_trainable(TrainableId(t)).coordinator_unit_index();
  }

  std::shared_ptr<torch::nn::Module> module_;
  Plan plan_;
  DistContext dist_;
  MemoryLedger ledger_;                   // before everything that registers in it
  std::unique_ptr<Communicators> comms_;  // every collective, by the job it does
  GroupTable groups_;                     // the flat groups and the index spaces over them
  // Offload: the I/O engine and swap directories outlive everything that swaps.
  std::unique_ptr<SwapSpace> swap_;
  std::unique_ptr<StepPipeline> pipeline_;  // reducer, scaler, optimizer, overlapped step
  ParamGroupTable param_groups_;
  LrSchedule schedule_;  // the config's scheduler (inactive without one)
  // After a load of the scheduler's position without the optimizer's state: the values the
  // groups keep until the schedule advances from `advanced` (load_checkpoint says why).
  struct HeldSchedule {
    int64_t advanced = 0;
    std::vector<ScheduledGroup> values;
  };
  std::optional<HeldSchedule> held_schedule_;
  // The config scheduler's values for the next step (held ones after such a load).
  std::vector<ScheduledGroup> scheduled_now() const;
  std::unique_ptr<UnitSchedule> units_;  // stage 3: gathers and releases per unit, ParamHome
  std::unique_ptr<ModuleBuffers> buffers_;
  // The model's device, the bytes the plan budgets that tier with, and the activations
  // memory_report counts on it (set_activation_shape; none: it counts none).
  struct ModelDevice {
    c10::Device where{c10::kCPU};
    int64_t capacity = 0;
    std::optional<std::pair<ModelSpec, TrainingShape>> activations;
  };
  ModelDevice device_;
};

}  // namespace zeroshard
