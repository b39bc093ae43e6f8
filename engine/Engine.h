#pragma once
// zeroshard::Engine: trains a LibTorch module with ZeRO sharding across the ranks the
// launcher started. Usage per micro-batch:
//   auto loss = compute_loss(engine.module(), batch);
//   engine.backward(loss);
//   engine.step();  // steps the optimizer at each gradient-accumulation boundary
//
// Stage 3 shards every parameter, by unit. LibTorch modules have no forward hooks, so
// every read of a unit's parameters goes through run_unit with one of the unit's modules,
// which gathers them, runs the function, arranges the gather again for backward, and
// frees them:
//   h = engine.run_unit(*block, [&] { return block->forward(h); });
//   logits = engine.run_unit(*embedding, [&] { return h.matmul(embedding->weight.t()); });
// Units (engine/UnitPartition.h): the blocks of every stack, or EngineOptions::units, and
// every module left over with parameters. Every rank calls run_unit for the units it
// uses, skipping any, in the order of the other ranks.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "common/MemoryLedger.h"
#include "config/Config.h"
#include "config/LaunchEnv.h"
#include "engine/DeviceMemory.h"
#include "engine/ModuleBuffers.h"
#include "engine/ParamGroups.h"
#include "plan/MemoryModel.h"
#include "plan/Planner.h"
#include "sharding/FlatParamGroup.h"

namespace zeroshard {

class EngineImpl;

// Brings one group's parameters to their initial values, the same on every rank, just
// before the engine copies them into its buffers: a collective, called for each group in
// the same order on every rank. The default broadcasts rank 0's values. The Python
// package passes one that gathers parameters built sharded (zeroshard.init), so that no
// rank ever holds more than its shards plus one group whole.
using MaterializeParams = std::function<void(const std::vector<NamedParam>&)>;

struct EngineOptions {
  std::optional<LaunchEnv> launch;  // default: read from the environment
  // Stage 3's blocks (default: every stack's); the rest of the model is cut into units
  // around them (engine/UnitPartition.h).
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  std::vector<ParamGroup> param_groups;  // default: one group, the config's optimizer values
};

struct MemoryReport {
  LedgerSnapshot measured;
  MemoryBreakdown predicted;    // the Planner's model states for this model and plan
  int64_t device_capacity = 0;  // bytes of the device tier the plan was made for, per rank
  std::optional<AllocatorStats> allocator;  // the model's GPU's caching allocator
  std::string to_string() const;
};

class Engine {
 public:
  Engine(std::shared_ptr<torch::nn::Module> module, const Config& config,
         EngineOptions options = {});
  // For models that are not a torch::nn::Module (the Python package): every trainable
  // parameter once (registration order), and each stage-3 unit's parameters. Units are
  // then driven by index through the unit_* calls (Python's module hooks). `buffers`:
  // the model's buffers, kept in step across ranks (engine/ModuleBuffers.h).
  Engine(std::vector<NamedParam> params, std::vector<std::vector<NamedParam>> unit_params,
         const Config& config, std::optional<LaunchEnv> launch = std::nullopt,
         std::vector<ParamGroup> param_groups = {}, MaterializeParams materialize = {},
         std::vector<NamedBuffer> buffers = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  torch::nn::Module& module();
  // Runs `forward` (the forward of `unit`) with the unit's parameters gathered; at
  // stages 0-2 it only calls `forward`.
  at::Tensor run_unit(const torch::nn::Module& unit, const std::function<at::Tensor()>& forward);
  // run_unit in pieces, by unit index (stages 0-2, and units without parameters: no-ops):
  // before the unit's forward, after it, and when its output's gradient arrives.
  void unit_forward_begin(size_t unit);
  void unit_forward_end(size_t unit);
  void unit_backward_begin(size_t unit);
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
  void backward(const at::Tensor& loss);
  // Copies of every parameter, whole, in the module's named_parameters() order. At stage
  // 3 this gathers each unit in turn: a collective, so every rank must call it.
  std::vector<NamedParam> full_parameters();
  // True when the optimizer stepped: at an accumulation boundary, without overflow.
  bool step();
  void zero_grad();

  double loss_scale() const;
  double global_grad_norm() const;
  double lr() const;  // parameter group 0's
  // Optimizer parameter groups: their options as given (or set since), and the
  // hyperparameters each will step with next (a config scheduler's lr included).
  size_t param_group_count() const;
  const ParamGroupOptions& param_group(size_t group) const;
  void set_param_group(size_t group, const ParamGroupOptions& options);
  std::vector<AdamHyper> param_group_hypers() const;
  int64_t optimizer_steps() const;
  const Plan& plan() const;
  const Config& config() const;
  int rank() const;
  int world_size() const;
  MemoryReport memory_report() const;
  // Bytes this rank has sent in collectives so far (ring-algorithm volume).
  int64_t bytes_sent() const;
  // Returns once every rank has called it (a rank that is gone fails it as any
  // collective does): for files one rank writes and every rank may read next.
  void barrier();
  MemoryLedger& ledger();

  // Sharded checkpoints (DeepSpeed's names). Each rank writes its own shards; rank 0
  // the manifest; DIR/latest moves last. Returns the tag (default global_stepN).
  // client_state: JSON text stored in the manifest; so are the parameter groups' options
  // and lr_scheduler, a client scheduler's state (JSON text, empty: none), as DeepSpeed
  // stores both. Collectives: every rank calls them.
  std::string save_checkpoint(const std::string& dir, std::string tag = "",
                              const std::string& client_state_json = "{}",
                              const std::string& lr_scheduler_json = "");
  // Loads DIR/TAG (TAG empty: DIR/latest) saved at any world size and stage; every file
  // and the layout are checked before anything changes. The parameter groups' options
  // come back (the checkpoint must hold as many groups as the engine has).
  struct Loaded {
    std::string client_state_json;
    std::string lr_scheduler_json;  // "null" when the checkpoint holds none
  };
  Loaded load_checkpoint(const std::string& dir, const std::string& tag = "");
  // Names under which a parameter is also reachable (tied weights): recorded in
  // checkpoints so a consolidated state_dict has every name. Found from the module in
  // the module constructor; the Python package passes them.
  void set_aliases(std::vector<std::pair<std::string, std::string>> aliases);

 private:
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace zeroshard
