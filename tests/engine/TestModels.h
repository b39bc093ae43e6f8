#pragma once
// The models, data and scenarios the multi-rank tests train, shared by the rank worker
// and by the single-process reference so both see the same thing.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "config/Config.h"

namespace zeroshard::testing {

struct Scenario {
  std::string model = "mlp";  // mlp | transformer
  int stage = 0;
  int steps = 10;
  int accum = 1;
  double clip = 0;
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  int batch = 8;               // global micro-batch, split over ranks
  int64_t bucket = 300;        // reduce_bucket_size: small, so there are many groups
  bool frozen = false;         // parameters with requires_grad = false (see TestModels.cpp)
  bool unused = false;         // one layer used only on even steps
  bool overlap = false;        // overlap_comm
  bool branch = false;         // a layer runs only where the rank's own data says so
  int scale = 1;               // mlp widths x scale
  int64_t prefetch = -1;       // stage3_prefetch_bucket_size (-1: default)
  int64_t live = -1;           // stage3_max_live_parameters
  int64_t persist = -1;        // stage3_param_persistence_threshold
  int overflow_at = -1;        // fp16: make this step's gradients infinite
  int die_at = -1;             // the last rank exits abruptly in this step's backward
  double timeout = 300;        // comm_timeout_seconds
  double lr = 1e-3;
  double weight_decay = 0.01;
  std::string offload_opt = "none";    // offload_optimizer.device
  std::string offload_param = "none";  // offload_param.device
  std::string nvme_path;               // both offloads' nvme_path
  int64_t sub_group = -1;              // sub_group_size (-1: default)
  int64_t max_in_cpu = -1;             // offload_param.max_in_cpu (-1: default)
  int buffers = 3;                     // buffer_count of both offloads
  int mics = -1;                       // mics_shard_size (-1: shard across all ranks)
  int hpz = 1;                         // zero_hpz_partition_size (1: no secondary copy)
  std::string device = "cpu";          // cpu | cuda: where the model and its data are
  std::string overlap_step = "auto";   // offload_optimizer.overlap_step
  double ratio = 1;                    // offload_optimizer.ratio (-1: auto)
  bool counter = false;  // mlp: a buffer starting at 100 x rank, plus each forward's input mean
  bool broadcast_buffers = true;

  static Scenario parse(const std::vector<std::string>& args);  // key=value
  std::vector<std::string> to_args() const;
  Config config() const;
};

using UnitRunner =
    std::function<at::Tensor(const torch::nn::Module&, const std::function<at::Tensor()>&)>;

class TestModel : public torch::nn::Module {
 public:
  // Mean loss over rows [begin, end) of micro-batch `micro` of step `step`.
  virtual at::Tensor loss(int step, int micro, int64_t begin, int64_t end) = 0;
  // The stage-3 units, and how their forwards are run (Engine::run_unit in a rank).
  virtual std::vector<std::shared_ptr<torch::nn::Module>> units() = 0;
  UnitRunner run_unit = [](const torch::nn::Module&, const std::function<at::Tensor()>& f) {
    return f();
  };
};

std::shared_ptr<TestModel> make_model(const Scenario& s);

}  // namespace zeroshard::testing
