#pragma once
// zeroshard::Engine: trains a LibTorch module with ZeRO sharding (stages 0-3, optimizer
// and parameter offload) across the ranks the launcher started (torchrun, srun, mpirun).
//
//   auto engine = zeroshard::Engine::create(model, "configs/zero3.yaml");
//   for (auto& batch : data) {
//     auto loss = compute_loss(engine->module(), batch);
//     engine->backward(loss);
//     engine->step();  // steps the optimizer at each gradient-accumulation boundary
//   }
//
// Stage 3 shards every parameter, by unit. LibTorch modules have no forward hooks, so
// every read of a unit's parameters goes through run_unit with one of the unit's modules,
// which gathers them, runs the function, arranges the gather again for backward, and
// frees them:
//   h = engine->run_unit(*block, [&] { return block->forward(h); });
//   logits = engine->run_unit(*embedding, [&] { return h.matmul(embedding->weight.t()); });
// Units: the blocks of every stack (ModuleList, Sequential, ModuleDict), or
// EngineOptions::units, and every module left over with parameters in a unit of its own.
// Every rank calls run_unit for the units it uses, skipping any, in the order of the
// other ranks. Errors are thrown as std::runtime_error with a message naming the cause.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "zeroshard/Types.h"

namespace zeroshard {

struct EngineOptions {
  // Stage 3's blocks (default: every stack's); the rest of the model is cut into units
  // around them.
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  // Optimizer parameter groups (default: one group with the config's optimizer values).
  std::vector<ParamGroup> param_groups;
};

class Engine {
 public:
  // Reads `config_file` (YAML, or DeepSpeed's JSON; its keys are DeepSpeed's) and the
  // launcher's environment, joins the other ranks, and shards `module`'s parameters. A
  // collective: every rank calls it.
  static std::unique_ptr<Engine> create(std::shared_ptr<torch::nn::Module> module,
                                        const std::string& config_file, EngineOptions options = {});
  virtual ~Engine();

  virtual torch::nn::Module& module() = 0;
  // Runs `forward` (the forward of `unit`) with the unit's parameters gathered; at
  // stages 0-2 it only calls `forward`.
  virtual at::Tensor run_unit(const torch::nn::Module& unit,
                              const std::function<at::Tensor()>& forward) = 0;
  // retain_graph: autograd keeps the graph for another backward through it.
  virtual void backward(const at::Tensor& loss, bool retain_graph = false) = 0;
  // True when the optimizer stepped: at an accumulation boundary, without overflow.
  virtual bool step() = 0;
  virtual void zero_grad() = 0;
  // Copies of every parameter, whole, in named_parameters() order. At stage 3 this
  // gathers each unit in turn: a collective, so every rank must call it.
  virtual std::vector<NamedParam> full_parameters() = 0;

  virtual double loss_scale() const = 0;
  virtual double global_grad_norm() const = 0;
  virtual double lr() const = 0;  // parameter group 0's
  virtual size_t param_group_count() const = 0;
  virtual const ParamGroupOptions& param_group(size_t group) const = 0;
  // Takes effect at the next optimizer step.
  virtual void set_param_group(size_t group, const ParamGroupOptions& options) = 0;
  // The optimizer's own step count (its bias correction follows it), and the engine's:
  // they differ after a load that kept the optimizer's state (LoadOptions).
  virtual int64_t optimizer_steps() const = 0;
  virtual int64_t global_steps() const = 0;
  // This rank and the job's ranks, every one of them.
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The ranks ZeRO shards across: the world, or with tensor parallelism the ranks of this
  // rank's tp coordinate (world / tp of them). Gradients are averaged over them, and the
  // batch of one step is micro-batch x accumulation x data_parallel_size().
  virtual int data_parallel_rank() const = 0;
  virtual int data_parallel_size() const = 0;
  // What this rank holds, per tier and kind, beside what the memory model planned.
  virtual MemoryReport memory_report() const = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;

  // Sharded checkpoints (DeepSpeed's names). Each rank writes its own shards, rank 0 the
  // manifest; DIR/latest moves last. Returns the tag (default global_stepN).
  // client_state_json and lr_scheduler_json (JSON text; empty: none) are stored in the
  // manifest. Collectives: every rank calls them.
  virtual std::string save_checkpoint(const std::string& dir, std::string tag = "",
                                      const std::string& client_state_json = "{}",
                                      const std::string& lr_scheduler_json = "",
                                      const SaveOptions& options = {}) = 0;
  // Loads DIR/TAG (TAG empty: DIR/latest), saved at any world size and stage; every file
  // and the layout are checked before anything changes.
  virtual LoadedCheckpoint load_checkpoint(const std::string& dir, const std::string& tag = "",
                                           const LoadOptions& options = {}) = 0;

 protected:
  Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
};

}  // namespace zeroshard
