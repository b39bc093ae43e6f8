#pragma once
// Stage-3 parameter offload to NVMe: the units' parameter shards live in a swap file;
// the ParamCoordinator's walk prefetches the next units' shards into pinned buffers
// and fill() copies one into its gather just before the all-gather. After the
// optimizer step, store() writes a unit's updated shard back and frees its storage.
// On a GPU fill()'s copy runs on a copy stream (sharding/CopyStream.h) that the
// current stream then waits for, so the host goes on issuing work; a buffer is used
// again (read into, or written from) only once the copy that last read it has ended.
// Used from the training thread only.
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "common/MemoryLedger.h"
#include "sharding/CopyStream.h"
#include "sharding/FlatParamGroup.h"
#include "sharding/ParamCoordinator.h"

namespace zeroshard {

class IoEngine;
class PinnedPool;
class Swapper;

class ParamHome : public ShardHome {
 public:
  // unit_bytes: each of the coordinator's units' shard size; on_nvme: which of them live
  // here. The engine hands each unit's group over with adopt() as it builds it and writes
  // it out with store(), so construction never holds every shard at once. `device`: where
  // the gathers are; on a GPU the staging buffers are page-locked.
  ParamHome(std::vector<int64_t> unit_bytes, std::vector<bool> on_nvme, IoEngine* io,
            const std::string& swap_dir, int64_t buffer_count, MemoryLedger* ledger,
            c10::Device device = c10::Device(c10::kCPU));
  ~ParamHome() override;

  // The unit's group, just built (its shard not yet written: store() does that).
  void adopt(size_t unit, FlatParamGroup* group);

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
  int64_t take_slot(bool may_wait);  // once the copy that last read it has ended
  void finish_read(size_t unit);
  int64_t bytes_of(size_t unit) const;

  std::vector<int64_t> unit_bytes_;
  std::vector<FlatParamGroup*> units_;  // set by adopt()
  std::vector<bool> on_nvme_;
  std::vector<size_t> region_;  // per unit on NVMe: its swap region
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<Swapper> swapper_;
  std::vector<int64_t> free_;
  std::vector<Transfer> reads_;  // per unit: a prefetch in flight
  std::deque<Transfer> writes_;
  CopyStream uploads_;              // fill()'s copies to the device
  std::vector<CopyDone> uploaded_;  // per buffer: the copy that last read it
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
