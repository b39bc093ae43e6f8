#pragma once
// The tiers state can live in and the kinds of state zeroshard counts. Shared by the
// Planner's predictions and the MemoryLedger's measurements so the two line up.
#include <array>
#include <cstddef>

namespace zeroshard {

enum class Tier { Device = 0, Host, Nvme };
constexpr size_t kNumTiers = 3;

enum class Kind {
  Params = 0,       // parameters in compute precision (bf16/fp16, or fp32)
  MasterParams,     // fp32 master copy kept when compute is bf16/fp16
  Grads,            // gradients in compute precision
  GradsFp32,        // the fp32 gradient buffer the optimizer reads
  OptimizerStates,  // Adam m and v
  Activations,      // saved activations of forward
  CommBuckets,      // reduce / all-gather buckets
  GatheredParams,   // stage 3: full parameters live between gather and free
  PinnedBuffers,    // pinned host staging and NVMe swap buffers
  SecondaryParams,  // stage 3 with hpZ: parameters sharded inside the node, for backward
  Buffers,          // the model's buffers (BatchNorm statistics, masks), whole on every rank
};
constexpr size_t kNumKinds = 11;

constexpr std::array<const char*, kNumTiers> kTierNames{"device", "host", "nvme"};
constexpr std::array<const char*, kNumKinds> kKindNames{
    "params",           "master_params",    "grads",        "grads_fp32",
    "optimizer_states", "activations",      "comm_buckets", "gathered_params",
    "pinned_buffers",   "secondary_params", "buffers"};

constexpr const char* tier_name(Tier t) {
  return kTierNames[static_cast<size_t>(t)];
}
constexpr const char* kind_name(Kind k) {
  return kKindNames[static_cast<size_t>(k)];
}

}  // namespace zeroshard
