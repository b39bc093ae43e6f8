#pragma once
// Moves tensors' bytes between host memory and a swap file on NVMe. Each tensor has
// a region of the file (aligned for O_DIRECT); reads and writes are asynchronous.
// update_each() is the optimizer step's pipeline: while region i is updated in one
// pinned buffer, region i+1 (and further, as buffers allow) is being read and region
// i-1 written, so the step costs about max(I/O, compute), not their sum.
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/MemoryLedger.h"
#include "offload/IoEngine.h"
#include "offload/PinnedPool.h"
#include "offload/SwapFile.h"

namespace zeroshard {

// Where the last update_each() spent its wall time on the calling thread. When the
// pipeline overlaps, waiting_for_reads is pure I/O minus the updates; when it equals
// pure I/O, the device made no progress while update() ran.
struct SwapPassTimes {
  double waiting_for_reads = 0;  // seconds blocked on a region's read
  double updating = 0;           // seconds inside update()
  double draining = 0;           // seconds waiting for the last writes
};

class Swapper {
 public:
  // One swap file `name` in `dir` holding regions of the given sizes, counted in the
  // ledger on the NVMe tier under `kind`.
  Swapper(IoEngine* io, const std::string& dir, const std::string& name,
          const std::vector<int64_t>& region_bytes, MemoryLedger* ledger, Kind kind);

  size_t regions() const { return offsets_.size(); }
  int64_t region_bytes(size_t region) const { return bytes_.at(region); }
  // Bytes a transfer of the region moves (its size rounded up to the I/O alignment);
  // buffers given to read/write must hold that many.
  int64_t io_bytes(size_t region) const;

  std::future<void> write(size_t region, const void* source);
  std::future<void> read(size_t region, void* destination);

  // For each region in `order`: read it into a buffer of `pool`, call update(region,
  // buffer), write it back. Returns after every write has completed; on an error, the
  // first one is thrown once all transfers in flight have ended.
  // Fill: the buffers start undefined and update() fills them (nothing is read).
  // Drain: update() only looks at the buffers (nothing is written back).
  enum class Pass { Update, Fill, Drain };
  void update_each(const std::vector<size_t>& order, PinnedPool& pool,
                   const std::function<void(size_t region, void* buffer)>& update,
                   Pass pass = Pass::Update);

  const IoFile& file() const { return file_->file(); }
  const SwapPassTimes& last_pass() const { return last_pass_; }

 private:
  IoEngine* io_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> bytes_;
  std::unique_ptr<SwapFile> file_;
  LedgerEntry entry_;
  SwapPassTimes last_pass_;
};

}  // namespace zeroshard
