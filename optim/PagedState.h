#pragma once
// PagedState: an optimizer's per-element state on NVMe (offload_optimizer.device nvme
// with a torch.optim class, optim/ExternalOptimizer.h). Each group's shard is cut into
// swap regions of at most sub_group_size elements; a region holds its elements' state
// arrays back to back, fp32, and the Swapper streams the regions through pinned
// buffers: read ahead, the update, write behind.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"

namespace zeroshard {

class IoEngine;
class PinnedPool;
class Swapper;

struct ExternalStateSwap {
  IoEngine* io = nullptr;
  std::string dir;  // this rank's swap directory
  int64_t sub_group_numel = 100'000'000;
  int64_t buffer_count = 4;
  bool page_lock = false;  // the model is on a GPU: page-lock the buffers
};

// A swap region: elements [offset, offset + numel) of a group's shard.
struct StateRegion {
  size_t group = 0;
  int64_t offset = 0, numel = 0;
};

class PagedState {
 public:
  explicit PagedState(ExternalStateSwap options);
  ~PagedState();
  PagedState(const PagedState&) = delete;
  PagedState& operator=(const PagedState&) = delete;

  // Group `group`'s regions; every group before open().
  void add_group(size_t group, int64_t numel);
  const std::vector<StateRegion>& regions() const { return regions_; }
  // Lays out the swap file for `arrays` state arrays an element, counted in the ledger
  // (NVMe optimizer_states, and the pinned buffers); with none it stays closed.
  void open(size_t arrays, MemoryLedger* ledger);
  bool is_open() const { return swapper_ != nullptr; }

  // update(region, its arrays) for every region in order, each array a host fp32
  // tensor of the region's numel over the pinned buffer; what it leaves is written back.
  using Update = std::function<void(size_t region, const std::vector<at::Tensor>& arrays)>;
  void update_all(const Update& update);
  // A group's state, arrays[a] holding array a of the whole group: written to its
  // regions (fill) or read from them (drain).
  void fill(size_t group, const std::vector<const float*>& arrays);
  void drain(size_t group, const std::vector<float*>& arrays);

 private:
  std::vector<size_t> regions_of(size_t group) const;
  std::vector<at::Tensor> arrays_over(size_t region, void* buffer) const;

  ExternalStateSwap options_;
  std::vector<StateRegion> regions_;
  size_t arrays_ = 0;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<Swapper> swapper_;
  LedgerEntry entry_;
};

}  // namespace zeroshard
