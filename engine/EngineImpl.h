#pragma once
// The engine: zeroshard::Engine (include/zeroshard/Engine.h, the public API) and what the
// Python bindings, tools and tests need beyond it: the calls module hooks make (unit by
// index, forward begin and end, reads outside a unit), an engine built from a parameter
// list, and the plan, config, ledger and memory detail. Programs that use the engine
// include zeroshard/Engine.h; only the bindings, tools and tests include this. An
// EngineBuilder (engine/EngineBuilder.h) assembles its parts; its calls are defined in
// Engine.cpp (the factory and the questions), EngineImpl.cpp (the step) and
// EngineUnits.cpp (stage-3 units); checkpoints are a Checkpointer's (engine/Checkpointer.h).
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
#include "config/Config.h"
#include "config/LaunchEnv.h"
#include "config/LrSchedule.h"
#include "engine/Checkpointer.h"
#include "engine/DeviceMemory.h"
#include "engine/EnginePlan.h"
#include "engine/GroupLayout.h"
#include "engine/GroupTable.h"
#include "engine/ModuleBuffers.h"
#include "engine/ParamGroups.h"
#include "engine/ProcessGroupSetup.h"
#include "plan/MemoryModel.h"
#include "plan/Planner.h"
#include "sharding/FlatParamGroup.h"
#include "sharding/ShardQuantizer.h"
#include "zeroshard/Engine.h"

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
class ActivationStore;

// Brings one group's parameters to their initial values, the same on every rank, just
// before the engine copies them into its buffers: a collective, called for each group in
// the same order on every rank. The default broadcasts rank 0's values. The Python
// package passes one that gathers parameters built sharded (zeroshard.init), so that no
// rank ever holds more than its shards plus one group whole.
using MaterializeParams = std::function<void(const std::vector<NamedParam>&)>;

// The memory report in the runtime's own types (memory_report() is its public form).
struct MemoryDetail {
  LedgerSnapshot measured;
  MemoryBreakdown predicted;    // the Planner's model states for this model and plan
  int64_t device_capacity = 0;  // bytes of the device tier the plan was made for, per rank
  std::optional<AllocatorStats> allocator;  // the model's GPU's caching allocator
  MemoryReport to_public() const;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::shared_ptr<torch::nn::Module> module, const Config& config,
             EngineOptions options = {}, std::optional<LaunchEnv> launch = std::nullopt);
  // For models that are not a torch::nn::Module (the Python package): every trainable
  // parameter once (registration order), and each stage-3 unit's parameters. Units are
  // then driven by index through the unit_* calls (Python's module hooks). `buffers`:
  // the model's buffers, kept in step across ranks (engine/ModuleBuffers.h). `batch`:
  // what offload_optimizer.ratio auto plans room for (engine/EnginePlan.h).
  EngineImpl(std::vector<NamedParam> params, std::vector<std::vector<NamedParam>> unit_params,
             const Config& config, std::optional<LaunchEnv> launch = std::nullopt,
             std::vector<ParamGroup> param_groups = {}, MaterializeParams materialize = {},
             std::vector<NamedBuffer> buffers = {},
             std::optional<AssumedBatch> batch = std::nullopt);
  ~EngineImpl() override;
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  // zeroshard::Engine's calls (include/zeroshard/Engine.h says what each does).
  torch::nn::Module& module() override;
  at::Tensor run_unit(const torch::nn::Module& unit,
                      const std::function<at::Tensor()>& forward) override;
  void backward(const at::Tensor& loss, bool retain_graph = false) override;
  // backward() in two halves, around a backward the caller runs itself (a pipeline stage's:
  // autograd.backward from its outputs with the gradients the next stage sent). begin counts
  // the micro-batch and returns `loss` times fp16's scale (the last stage differentiates
  // it; the others' incoming gradients carry the scale already); end closes it.
  at::Tensor begin_backward(const at::Tensor& loss);
  void end_backward();
  // A micro-batch's backward split in two (zero-bubble pipeline schedules). The input half
  // differentiates the stage's inputs only: the units run their backward (gathered as in
  // any), no parameter's gradient lands, nothing is counted or reduced; begin returns `loss`
  // times fp16's scale. The weight half lands the parameters' gradients from what the input
  // half left: counted and reduced as a whole backward, the units untouched (it reads no
  // parameter).
  at::Tensor begin_input_backward(const at::Tensor& loss);
  void end_input_backward();
  void begin_weight_backward();
  void end_weight_backward();
  // Stage 3: every unit stays gathered from its first use in a step to the optimizer step,
  // across the micro-batches of a pipeline schedule (FSDP's reshard_after_forward=False);
  // the plan counts every parameter as gathered from then on.
  void keep_units_gathered_in_step();
  // Stages 2-3 under a pipeline schedule: gradients reduced once per step, not per
  // micro-batch (sharding/GradReducer.h reduce_once_per_window); planned as held whole.
  void reduce_once_per_step();
  // Interleaved pipeline schedules: `stages` of the pipeline's stages are this engine's
  // module's parts, each micro-batch running one backward through each; the micro-batch
  // (and the window's end) is counted at the last (engine/StepPipeline.h).
  void set_pipeline_stages_on_rank(int stages);
  bool step() override;
  void zero_grad() override;
  std::vector<NamedParam> full_parameters() override;
  double loss_scale() const override;
  double global_grad_norm() const override;
  double lr() const override;
  size_t param_group_count() const override;
  const ParamGroupOptions& param_group(size_t group) const override;
  void set_param_group(size_t group, const ParamGroupOptions& options) override;
  int64_t optimizer_steps() const override;
  int64_t global_steps() const override;
  // Windows an fp16 overflow skipped; the config scheduler's advances (config/LrSchedule.h).
  int64_t skipped_steps() const;
  int64_t schedule_steps() const;
  int rank() const override;
  int world_size() const override;
  int data_parallel_rank() const override;
  int data_parallel_size() const override;
  int tensor_parallel_size() const;
  int pipeline_parallel_size() const;
  // Ranks that split each sequence (config/Config.h); consecutive, inside the data-parallel
  // ranks.
  int sequence_parallel_size() const;
  int pipeline_stage() const;  // this rank's coordinate along pp
  MemoryReport memory_report() const override;
  void barrier() override;
  // The parameter groups' options are stored too, and come back on load (the checkpoint
  // must hold as many groups as the engine has).
  std::string save_checkpoint(const std::string& dir, std::string tag = "",
                              const std::string& client_state_json = "{}",
                              const std::string& lr_scheduler_json = "",
                              const SaveOptions& options = {}) override;
  LoadedCheckpoint load_checkpoint(const std::string& dir, const std::string& tag = "",
                                   const LoadOptions& options = {}) override;
  // Expert parallelism: the names the split experts' parameters are saved under
  // (engine/Checkpointer.h ExpertNames), given by the Python package.
  void set_expert_names(ExpertNames names);

  // run_unit in pieces, by unit index (stages 0-2, and units without parameters: no-ops):
  // before the unit's forward, after it, and when its output's gradient arrives.
  void unit_forward_begin(size_t unit);
  void unit_forward_end(size_t unit);
  void unit_backward_begin(size_t unit);
  // For module hooks: a forward of `unit` whose inputs need gradients; when it returns
  // true, call unit_inputs_done once their gradients are all computed (tensor hooks),
  // which lets the unit's frozen parameters go (engine/UnitRelease.h).
  bool unit_inputs_need_grad(size_t unit);
  void unit_inputs_done(size_t unit);
  // For module hooks (the Python package): the model's forward begins and ends (a forward
  // without gradients ends its gathers there; buffers are made equal across ranks where
  // one begins, as engine/ModuleBuffers.h says: a LibTorch program that never calls
  // model_forward_begin gets that at the end of each optimizer step instead); a
  // parameter of `unit` is read outside the unit's modules (ParamCoordinator::touch).
  // Both unit calls say how the unit's parameters are held now: 0 not at all, 1 for use,
  // 2 for a read outside forward and backward (ParamCoordinator::Held).
  void model_forward_begin();
  void model_forward_end(bool grad_enabled);
  int touch_unit(size_t unit, bool grad_enabled);
  int unit_held(size_t unit) const;
  // Outside forward/backward: a unit's full parameters, present until release_unit. A
  // collective: every rank calls it for the same units in the same order.
  void gather_unit(size_t unit);
  void release_unit(size_t unit);
  // After parameters were written outside training (gathered units, units kept whole):
  // `src_rank`'s values go to every rank, each keeps its shard of them, and the
  // optimizer's fp32 master restarts from them. A collective.
  void commit_parameters(int src_rank);
  // The hyperparameters each parameter group will step with next (a config scheduler's
  // lr included).
  std::vector<AdamHyper> param_group_hypers() const;
  // Backward passes so far (a checkpoint restores the count): the accumulation window's
  // position.
  int64_t micro_steps() const;
  const Plan& plan() const;
  const Config& config() const;
  MemoryDetail memory_detail() const;
  // memory_detail's prediction counts the activations of micro-batches of `micro_batch`
  // sequences of `seq` tokens of the model a Hugging Face config.json describes
  // (plan/HfConfig.h), with transformers' attention `attn_implementation`.
  // `has_head`: whether the module makes the logits (a pipeline stage before the last
  // does not).
  void set_activation_shape(const std::string& hf_config_json,
                            const std::string& attn_implementation, int64_t seq,
                            int64_t micro_batch, bool activation_checkpointing,
                            bool has_head = true);
  // The blocks the config's activation_checkpointing.mode recomputes at the batch
  // set_activation_shape described (plan/MemoryModel.h recomputed_layers); none before it.
  std::optional<Recomputed> recomputed_layers() const;
  // Where activation_checkpointing.offload keeps the blocks' saved activations (host
  // blocks, NVMe regions), counted in this engine's ledger; made at the first call.
  std::shared_ptr<ActivationStore> activation_store();
  // A pipeline stage's schedule: the most micro-batches whose activations it held at once
  // in a step as the schedule ran them, of `micro_batches` a step (its outputs kept until
  // step() returns them); memory_detail's prediction counts them (TrainingShape::in_flight).
  void set_pipeline_in_flight(int64_t in_flight, int64_t micro_batches);
  // Bytes this rank has sent in collectives so far (ring-algorithm volume).
  int64_t bytes_sent() const;
  MemoryLedger& ledger();
  // Names under which a parameter is also reachable (tied weights): recorded in
  // checkpoints so a consolidated state_dict has every name. Found from the module in
  // the module constructor; the Python package passes them.
  void set_aliases(std::vector<std::pair<std::string, std::string>> aliases);
  // The optimizer a torch.optim class is (config optimizer.external): its groups' masters
  // to build the class on, and the hooks that step it. An Error for zeroshard's Adam.
  ExternalOptimizer& external_optimizer();
  // Sums `tensor` in place over the ranks whose shards make up whole parameters (the
  // shard group; nothing at stage 0, where every rank holds them whole). A collective:
  // the optimizer's step calls it on every rank in the same order.
  void reduce_across_shards(at::Tensor& tensor);

 private:
  // A counted backward opened (the micro-step, the overlapped step, the reducer): `loss`
  // times fp16's scale.
  at::Tensor open_backward(const at::Tensor& loss);
  // After the update: the updated shards reach every rank that holds the whole group.
  bool finish_step();
  // This rank's shard and the number of shards: its place in its shard group
  // (mics_shard_size), or among all ranks without groups.
  int shard_rank() const { return dist_.shard_rank(); }
  int shard_count() const { return dist_.shard_size(); }
  friend class EngineBuilder;  // assembles the parts below (engine/EngineBuilder.h)
  // Stage 3's schedule for `unit` (null at stages 0-2); fails for a unit that does not
  // exist.
  UnitSchedule* schedule_of(size_t unit) const;
  void check_read(size_t trainable_group, size_t slot) const;
  // The parts a Checkpointer (engine/Checkpointer.h) saves and loads.
  CheckpointParts checkpoint_parts();
  // Where stage 3's shards on NVMe live (the unit schedule's); null without any.
  ParamHome* param_home() const;
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
  // weight_quantization: what frozen groups' shards are kept as; outlives the groups.
  std::unique_ptr<ShardQuantizer> quantizer_;
  bool grads_held_in_window_ = false;                     // reduce_once_per_step()
  std::pair<int64_t, int64_t> pipeline_in_flight_{1, 0};  // set_pipeline_in_flight()
  GroupTable groups_;  // the flat groups and the index spaces over them
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
  // The batch memory_detail counts, `spec` given its model's shape: the activations set,
  // the pipeline's micro-batches in flight, mode auto's blocks recomputed for them.
  TrainingShape counted_shape(ModelSpec& spec) const;
  ExpertNames expert_names_;
  std::shared_ptr<ActivationStore> activation_store_;  // activation_store(); detached at the end
};

}  // namespace zeroshard
