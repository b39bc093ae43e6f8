#pragma once
// How reduced gradient shards reach an offloaded optimizer's host accumulators when the
// gradients are on a GPU (sharding/GradReducer.h): each shard, reduced on the device, is
// copied on a copy stream of its own (sharding/CopyStream.h) and "lands" in the group's
// host accumulator while backward goes on. Into a clean accumulator (nothing summed since
// it was zeroed) the copy goes straight in; otherwise into a pinned staging buffer, added
// when the landing is settled. A landing is settled (its copy waited for, its staging
// added) before the host reads the accumulator: settle(group) from any thread. At most
// two landings are unsettled at a time, which bounds their buffers.
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"
#include "sharding/CopyStream.h"

namespace zeroshard {

class HostLandings {
 public:
  // `accumulators[g]`: group g's host accumulator, kept by the caller for as long as
  // this object lives.
  HostLandings(c10::Device device, std::vector<at::Tensor>* accumulators, MemoryLedger* ledger);

  // Starts group `group`'s landing of `received` (on the device); `clean`: nothing is
  // summed in the accumulator yet. Training thread only.
  void land(size_t group, const at::Tensor& received, bool clean);
  // The group's landing (if one is left) has ended and is in its accumulator. Any thread.
  void settle(size_t group);
  void settle_all();  // training thread only

 private:
  struct Landing {
    CopyDone done;
    at::Tensor staging;  // pinned; none when the copy went into the clean accumulator
    LedgerEntry device_bytes, host_bytes;
  };
  CopyStream copies_;
  std::vector<at::Tensor>* accumulators_;
  MemoryLedger* ledger_;
  std::vector<std::optional<Landing>> landings_;
  std::unique_ptr<std::mutex[]> mutexes_;
  std::deque<size_t> order_;  // unsettled groups, oldest first
};

}  // namespace zeroshard
