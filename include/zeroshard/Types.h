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
};

// One optimizer parameter group's own hyperparameters, as torch's param_groups hold
// them; what a group leaves unset comes from the config's `optimizer` section.
struct ParamGroupOptions {
  std::optional<double> lr, beta1, beta2, eps, weight_decay;
  std::optional<bool> decoupled;  // unset: the config's optimizer type (AdamW decouples)
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
  std::string lr_scheduler_json;  // "null" when the checkpoint holds none
};

}  // namespace zeroshard
