#pragma once
// The values zeroshard::Engine (zeroshard/Engine.h) takes and returns. Plain structs over
// LibTorch's tensors and the standard library: a program that uses the engine needs no
// other zeroshard header.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace zeroshard {

// A parameter and the name the model gives it (named_parameters()).
struct NamedParam {
  std::string name;
  at::Tensor param;
  // The dimension along which this rank holds its own slice of a parameter split across
  // the tensor-parallel ranks (Megatron's tensor_model_parallel and partition_dim); -1:
  // every tp rank holds it whole, and the gradient norm counts it once.
  int tensor_parallel_dim = -1;
  bool tensor_parallel() const { return tensor_parallel_dim >= 0; }
  // The weight of an nn.Linear or nn.Embedding (torch::nn::Linear, Embedding): what
  // weight_quantization quantizes, as DeepSpeed does; every other parameter stays as it is.
  bool quantizable = false;
  // A parameter of the experts split across the expert-parallel ranks (DeepSpeed's MoE layer
  // at ep_size > 1): each ep rank holds other experts, so its gradient is reduced and its
  // optimizer state sharded over the expert-data-parallel ranks (engine/ParallelDims.h edp)
  // alone; every other parameter over all data-parallel ranks.
  bool expert = false;
};

// One optimizer parameter group's own hyperparameters, as torch's param_groups hold
// them; what a group leaves unset comes from the config's `optimizer` section.
struct ParamGroupOptions {
  std::optional<double> lr, beta1, beta2, eps, weight_decay;
  std::optional<bool> decoupled;        // unset: the config's optimizer type (AdamW decouples)
  std::optional<bool> bias_correction;  // unset: the config's (DeepSpeed's Adam classes set it)
};

struct ParamGroup {
  std::vector<at::Tensor> params;
  ParamGroupOptions options;
};

// The CUDA caching allocator's aggregate counts for one device, in bytes:
// torch.cuda.memory_allocated(), max_memory_allocated() and max_memory_reserved().
struct AllocatorStats {
  int64_t allocated = 0;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
};

// Bytes of one kind of state on one tier, as this rank holds them and as the memory
// model planned them (docs/memory-model.md names the tiers and kinds).
struct MemoryUse {
  std::string tier;  // device, host, nvme
  std::string kind;  // params, master_params, grads, optimizer_states, ...
  int64_t current = 0;
  int64_t peak = 0;
  int64_t predicted = 0;
};

struct TierUse {
  std::string tier;
  int64_t current = 0;
  int64_t peak = 0;  // the peak of the tier's sum, not a sum of the kinds' peaks
  int64_t predicted = 0;
};

struct MemoryReport {
  std::vector<MemoryUse> uses;  // every tier, every kind
  std::vector<TierUse> tiers;
  int64_t device_capacity = 0;              // bytes per rank the plan was made for
  std::optional<AllocatorStats> allocator;  // the model's GPU's caching allocator
  std::string to_string() const;            // the device tier, kind by kind
};

// What load_checkpoint hands back of what save_checkpoint stored beside the state.
struct LoadedCheckpoint {
  std::string client_state_json;
  std::string lr_scheduler_json;  // "null" when the checkpoint holds none or it was not asked for
};

// What save_checkpoint writes beside every rank's shards (DeepSpeed's keywords).
struct SaveOptions {
  bool latest = true;             // DIR/latest names this tag afterwards (save_latest)
  bool frozen_parameters = true;  // false: parameters that do not train are left out
                                  // (exclude_frozen_parameters; loading then needs strict false)
};

// What load_checkpoint restores (DeepSpeed's keywords). By default everything: the
// parameters, buffers, the optimizer's state and step count, the parameter groups'
// hyperparameters, the loss scale, the step counts, the schedule's position and the
// random streams.
struct LoadOptions {
  // Every parameter and buffer on both sides, by name (load_module_strict). False: what
  // the checkpoint lacks keeps the model's values, what the model lacks is skipped;
  // shapes must still agree, and a trainable parameter the checkpoint lacks needs
  // optimizer_states false (its state would be missing).
  bool strict = true;
  // False: the optimizer keeps the state it has (a fresh one after construction), and
  // its fp32 master restarts from the loaded parameters; the step counts and the random
  // streams are restored (load_optimizer_states).
  bool optimizer_states = true;
  // False: the schedule's position (a config scheduler's, and a client scheduler's state
  // handed back) stays where this engine has it (load_lr_scheduler_states).
  bool lr_scheduler = true;
  // Parameters and buffers only; nothing else changes (load_module_only).
  bool module_only = false;
};

}  // namespace zeroshard
