#pragma once
// Rendezvous through c10d's TCPStore and a Gloo process group for CPU tensors
// (NCCL for CUDA joins here when built with it). One process (world size 1) gets
// no group: every collective is then a no-op.
#include <chrono>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/TorchCompat.h"
#include "runtime/LaunchEnv.h"

namespace zeroshard {

struct DistContext {
  LaunchEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::CommBackend> group;  // null when world_size == 1
  // A second group for stage-3 parameter gathers, issued from inside backward in
  // schedule order while gradient reductions go on in theirs: each group sees one
  // fixed order on every rank.
  c10::intrusive_ptr<compat::CommBackend> param_group;
  std::chrono::milliseconds timeout{300'000};

  // After a collective failed: which ranks no longer answer, e.g. "rank 1 did not
  // respond within 3 s" (asks the survivors through the store).
  std::string describe_missing_ranks() const;
};

DistContext init_distributed(const LaunchEnv& env, std::chrono::milliseconds timeout);

}  // namespace zeroshard
