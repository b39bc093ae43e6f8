#pragma once
// zeroshard::Engine: trains a LibTorch module with ZeRO sharding across the ranks the
// launcher started. Usage per micro-batch:
//   auto loss = compute_loss(engine.module(), batch);
//   engine.backward(loss);
//   engine.step();  // steps the optimizer at each gradient-accumulation boundary
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "common/MemoryLedger.h"
#include "runtime/Config.h"
#include "runtime/LaunchEnv.h"
#include "runtime/MemoryModel.h"
#include "runtime/Planner.h"
#include "runtime/ProcessGroupSetup.h"
#include "sharding/FlatParamGroup.h"

namespace zeroshard {

class Collectives;
class GradReducer;
class OptimizerShard;
class LossScaler;

struct EngineOptions {
  std::optional<LaunchEnv> launch;  // default: read from the environment
};

struct MemoryReport {
  LedgerSnapshot measured;
  MemoryBreakdown predicted;  // the Planner's model states for this model and plan
  std::string to_string() const;
};

class Engine {
 public:
  Engine(std::shared_ptr<torch::nn::Module> module, const Config& config,
         EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  torch::nn::Module& module() { return *module_; }
  void backward(const at::Tensor& loss);
  // True when the optimizer stepped: at an accumulation boundary, without overflow.
  bool step();
  void zero_grad();

  double loss_scale() const;
  double global_grad_norm() const { return grad_norm_; }
  double lr() const;
  int64_t optimizer_steps() const;
  const Plan& plan() const { return plan_; }
  const Config& config() const { return plan_.config; }
  int rank() const { return dist_.env.rank; }
  int world_size() const { return dist_.env.world_size; }
  MemoryReport memory_report() const;
  MemoryLedger& ledger() { return ledger_; }

 private:
  void build_groups(const std::vector<NamedParam>& params);
  void broadcast_initial_values(const std::vector<NamedParam>& params);
  ModelSpec spec_of_groups() const;

  std::shared_ptr<torch::nn::Module> module_;
  Plan plan_;
  DistContext dist_;
  MemoryLedger ledger_;  // before everything that registers in it
  std::unique_ptr<Collectives> comm_;
  std::vector<std::unique_ptr<FlatParamGroup>> groups_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<OptimizerShard> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  int64_t micro_steps_ = 0;
  double grad_norm_ = 0;
};

}  // namespace zeroshard
