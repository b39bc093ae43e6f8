#include "engine/ParamHome.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <iterator>

#include <ATen/ATen.h>

#include "common/Error.h"
#include "common/FaultPoint.h"
#include "offload/IoEngine.h"
#include "offload/PinnedPool.h"
#include "offload/Swapper.h"

namespace zeroshard {

ParamHome::ParamHome(std::vector<int64_t> unit_bytes, std::vector<bool> on_nvme, IoEngine* io,
                     const std::string& swap_dir, int64_t buffer_count, MemoryLedger* ledger,
                     c10::Device device)
    : unit_bytes_(std::move(unit_bytes)),
      units_(unit_bytes_.size(), nullptr),
      on_nvme_(std::move(on_nvme)),
      uploads_(device) {
  std::vector<int64_t> bytes;
  int64_t largest = 0;
  region_.assign(units_.size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!on_nvme_[u]) continue;
    region_[u] = bytes.size();
    bytes.push_back(bytes_of(u));
    largest = std::max(largest, bytes_of(u));
  }
  reads_.resize(units_.size());
  if (bytes.empty()) return;
  pool_ = std::make_unique<PinnedPool>(std::max<int64_t>(1, buffer_count), largest, ledger,
                                       /*page_lock=*/!device.is_cpu());
  uploaded_.resize(static_cast<size_t>(pool_->count()));
  io->register_buffers(pool_->all());
  for (int64_t i = 0; i < pool_->count(); ++i) free_.push_back(pool_->acquire());
  swapper_ = std::make_unique<Swapper>(io, swap_dir, "params", bytes, ledger, Kind::Params);
}

void ParamHome::adopt(size_t unit, FlatParamGroup* group) {
  const int64_t bytes = group->kept_bytes();
  if (bytes != unit_bytes_.at(unit))
    fail("ParamHome: unit {}'s shard is {} bytes; {} were planned", unit, bytes,
         unit_bytes_.at(unit));
  units_[unit] = group;
}

ParamHome::~ParamHome() {
  for (const CopyDone& copy : uploaded_) copy.wait();
  try {
    for (size_t u = 0; u < units_.size(); ++u)
      if (reads_[u].slot >= 0) reads_[u].done.wait();
    for (auto& w : writes_) w.done.wait();
  } catch (...) {
  }
  if (pool_) {
    for (auto& r : reads_)
      if (r.slot >= 0) free_.push_back(r.slot);
    for (auto& w : writes_) free_.push_back(w.slot);
    for (int64_t s : free_) pool_->release(s);
  }
}

int64_t ParamHome::bytes_of(size_t unit) const {
  return unit_bytes_[unit];
}

// A free buffer; with `may_wait`, the oldest write is waited for, or else a prefetched
// shard nobody has asked for yet gives its buffer up. -1 when none is free right now.
int64_t ParamHome::take_slot(bool may_wait) {
  if (free_.empty() && !writes_.empty()) {
    auto& oldest = writes_.front();
    const bool ready = oldest.done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    if (ready || may_wait) {
      Transfer w = std::move(oldest);
      writes_.pop_front();
      free_.push_back(w.slot);
      w.done.get();
    }
  }
  if (free_.empty() && may_wait) {
    for (size_t u = 0; u < reads_.size() && free_.empty(); ++u) {
      if (reads_[u].slot < 0) continue;
      reads_[u].done.wait();
      free_.push_back(reads_[u].slot);
      reads_[u] = Transfer{};
    }
  }
  // A free buffer whose copy to the device has ended, else (with `may_wait`) the last.
  auto pick = std::find_if(free_.rbegin(), free_.rend(),
                           [&](int64_t s) { return uploaded_[static_cast<size_t>(s)].ready(); });
  if (pick == free_.rend()) {
    if (free_.empty() || !may_wait) return -1;
    pick = free_.rbegin();
  }
  const int64_t slot = *pick;
  free_.erase(std::next(pick).base());
  uploaded_[static_cast<size_t>(slot)].wait();
  return slot;
}

void ParamHome::prefetch(size_t unit) {
  if (!on_nvme_[unit] || reads_[unit].slot >= 0) return;
  const int64_t slot = take_slot(/*may_wait=*/false);
  if (slot < 0) return;  // no buffer free: fill() reads it when it is needed
  reads_[unit] = {slot, swapper_->read(region_[unit], pool_->buffer(slot))};
}

void ParamHome::finish_read(size_t unit) {
  Transfer t = std::move(reads_[unit]);
  reads_[unit] = Transfer{};
  free_.push_back(t.slot);
  t.done.get();
}

void ParamHome::fill(size_t unit, const at::Tensor& slice) {
  fault_point("nvme.param_read");
  if (reads_[unit].slot < 0) {
    const int64_t slot = take_slot(/*may_wait=*/true);
    reads_[unit] = {slot, swapper_->read(region_[unit], pool_->buffer(slot))};
  }
  const int64_t slot = reads_[unit].slot;
  finish_read(unit);  // take_slot() hands the buffer out again once the copy below ends
  if (units_[unit]->quantized()) {  // decoded into the slice before the buffer goes back
    units_[unit]->decode_kept(
        at::from_blob(pool_->buffer(slot), {bytes_of(unit)}, at::TensorOptions(at::kByte)), slice);
    return;
  }
  // `slice` is in the full buffer: on a GPU a copy up that the current stream waits for
  // (the host does not), else memcpy.
  const at::Tensor staged =
      at::from_blob(pool_->buffer(slot), slice.sizes(), slice.options().device(at::kCPU));
  uploaded_[static_cast<size_t>(slot)] = uploads_.copy(slice, staged);
  uploaded_[static_cast<size_t>(slot)].before_current();
}

void ParamHome::open_for_update(size_t unit) {
  if (!on_nvme_[unit]) return;
  if (reads_[unit].slot >= 0) finish_read(unit);  // a prefetch of the old values
  units_[unit]->materialize_shard();
}

void ParamHome::store(size_t unit) {
  if (!on_nvme_[unit]) return;
  fault_point("nvme.param_write");
  if (reads_[unit].slot >= 0) finish_read(unit);
  const int64_t slot = take_slot(/*may_wait=*/true);
  FlatParamGroup* g = units_[unit];
  std::memcpy(pool_->buffer(slot), g->param_shard().data_ptr(),
              static_cast<size_t>(bytes_of(unit)));
  writes_.push_back({slot, swapper_->write(region_[unit], pool_->buffer(slot))});
  g->release_shard();
}

void ParamHome::flush() {
  while (!writes_.empty()) {
    Transfer w = std::move(writes_.front());
    writes_.pop_front();
    free_.push_back(w.slot);
    w.done.get();
  }
}

ShardUpdate::ShardUpdate(ParamHome* home, int unit) : exceptions_(std::uncaught_exceptions()) {
  if (home == nullptr || unit < 0 || !home->holds(static_cast<size_t>(unit))) return;
  home_ = home;
  unit_ = static_cast<size_t>(unit);
  home_->open_for_update(unit_);
}

ShardUpdate::~ShardUpdate() noexcept(false) {
  if (home_ != nullptr && std::uncaught_exceptions() == exceptions_) home_->store(unit_);
}

}  // namespace zeroshard
