#pragma once
// A model's buffers (BatchNorm's running statistics, masks, position tables): tensors a
// module registers that no optimizer steps. Every rank holds them whole. Forward
// updates some from each rank's own batch, so they drift apart unless kept in step.
//
// The rule is torch DDP's (`broadcast_buffers`, on by default): before a forward, rank
// 0's buffers overwrite every rank's, when the forward before it was one whose
// gradients are synchronised (gradients enabled, the micro-batch that ends an
// accumulation window, as DDP's no_sync leaves the others), and before the first
// forward. So one broadcast per optimizer step, made of every buffer's bytes in one
// flat tensor, and the ranks compute with exactly the buffers DDP's ranks would. A
// forward without gradients (evaluation) after a synchronised one starts from rank 0's
// buffers too. EngineImpl calls forward_begin/forward_end from the model's forward
// hooks (the Python package), or broadcast() at the end of each optimizer step for a
// LibTorch module, which has no hooks: its next forward sees the same buffers.
//
// Checkpoints hold rank 0's persistent buffers once (engine/Checkpointer.cpp);
// the ledger counts all of them as the device tier's `buffers`.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"

namespace zeroshard {

class Collectives;

struct NamedBuffer {
  std::string name;
  at::Tensor tensor;
  bool persistent = true;  // in the state_dict and in checkpoints (torch's meaning)
};

class ModuleBuffers {
 public:
  // `broadcast`: the config's broadcast_buffers. The buffers stay the module's: this
  // holds references, so a module that replaces a buffer object after the engine was
  // built is not followed (as DDP does not follow it).
  ModuleBuffers(std::vector<NamedBuffer> buffers, bool broadcast, MemoryLedger* ledger);

  // DDP's pre-forward rule (above). Once it was called, forwards drive the broadcasts.
  void forward_begin(Collectives& comm);
  // `synchronised`: this forward's gradients will be reduced at its backward.
  void forward_end(bool synchronised) { due_ = synchronised; }
  // Rank 0's buffers to every rank now, when broadcast_buffers is on. A collective.
  void broadcast(Collectives& comm);
  // After an optimizer step: a model whose forwards are not hooked (a LibTorch module)
  // gets rank 0's buffers now, so its next forward sees what the broadcast at that
  // forward's beginning would give. A collective, or nothing once forwards are hooked.
  void after_step(Collectives& comm) {
    if (!forwards_hooked_) broadcast(comm);
  }

  const std::vector<NamedBuffer>& all() const { return buffers_; }
  const NamedBuffer* find(const std::string& name) const;
  // A buffer's bytes in host memory (for a file), and setting a buffer from bytes that
  // hold its shape in `dtype` (converted to the buffer's own; sizes checked by the caller).
  static at::Tensor host_bytes(const at::Tensor& buffer);
  static void assign(const at::Tensor& buffer, const at::Tensor& bytes, at::ScalarType dtype);
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<NamedBuffer> buffers_;
  bool enabled_;
  bool due_ = true;               // DDP broadcasts before its first forward
  bool forwards_hooked_ = false;  // forward_begin was called
  int64_t bytes_ = 0;
  MemoryLedger* ledger_;
  LedgerEntry entry_;
};

}  // namespace zeroshard
