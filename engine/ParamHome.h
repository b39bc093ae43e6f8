#pragma once
// Stage-3 parameter offload to NVMe: the units' parameter shards live in a swap file;
// the ParamCoordinator's walk prefetches the next units' shards into pinned buffers
// and fill() copies one into its gather just before the all-gather. After the
// optimizer step, store() writes a unit's updated shard back and frees its storage.
// Used from the training thread only.
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/MemoryLedger.h"
#include "sharding/FlatParamGroup.h"
#include "sharding/ParamCoordinator.h"

namespace zeroshard {

class IoEngine;
class PinnedPool;
class Swapper;

class ParamHome : public ShardHome {
 public:
  // units: the coordinator's units; on_nvme: which of them live here. Writes their
  // current shards out and frees them. `page_lock`: the shards are on a GPU, so the
  // staging buffers are page-locked.
  ParamHome(std::vector<FlatParamGroup*> units, std::vector<bool> on_nvme, IoEngine* io,
            const std::string& swap_dir, int64_t buffer_count, MemoryLedger* ledger,
            bool page_lock = false);
  ~ParamHome() override;

  bool holds(size_t unit) const override { return on_nvme_.at(unit); }
  void prefetch(size_t unit) override;
  void fill(size_t unit, const at::Tensor& slice) override;
  // Brings a unit's shard storage back so the optimizer can write it.
  void open_for_update(size_t unit);
  // Writes the unit's shard out (asynchronously) and frees its storage.
  void store(size_t unit);
  void flush();  // waits for every write

 private:
  struct Transfer {
    int64_t slot = -1;
    std::future<void> done;
  };
  int64_t take_slot(bool may_wait);
  void finish_read(size_t unit);
  int64_t bytes_of(size_t unit) const;

  std::vector<FlatParamGroup*> units_;
  std::vector<bool> on_nvme_;
  std::vector<size_t> region_;  // per unit on NVMe: its swap region
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<Swapper> swapper_;
  std::vector<int64_t> free_;
  std::vector<Transfer> reads_;  // per unit: a prefetch in flight
  std::deque<Transfer> writes_;
  LedgerEntry entry_;
};

// ParamHome's open_for_update/store bracket as a scope: while it lives, `unit`'s shard
// is in memory and may be written; when it ends the shard is written back. Nothing
// happens for no home, a negative unit or a unit kept in memory. Left by an exception
// it does not store (the shard stays resident; the error ends the step).
class ShardUpdate {
 public:
  ShardUpdate(ParamHome* home, int unit);
  ~ShardUpdate() noexcept(false);
  ShardUpdate(const ShardUpdate&) = delete;
  ShardUpdate& operator=(const ShardUpdate&) = delete;

 private:
  ParamHome* home_ = nullptr;
  size_t unit_ = 0;
  int exceptions_ = 0;
};

}  // namespace zeroshard
