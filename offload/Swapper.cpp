#include "offload/Swapper.h"

#include <chrono>
#include <deque>

#include "common/Alignment.h"
#include "common/Error.h"

namespace zeroshard {
namespace {

std::future<void> done_now() {
  std::promise<void> done;
  done.set_value();
  return done.get_future();
}

int64_t aligned(int64_t bytes) {
  return round_up(bytes, kIoAlignment);
}

// Adds the seconds f() takes to *total.
template <typename F>
void timed(double* total, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  *total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Swapper::Swapper(IoEngine* io, const std::string& dir, const std::string& name,
                 const std::vector<int64_t>& region_bytes, MemoryLedger* ledger, Kind kind)
    : io_(io), bytes_(region_bytes) {
  int64_t total = 0;
  for (int64_t b : region_bytes) {
    offsets_.push_back(total);
    total += aligned(b);
  }
  file_ = std::make_unique<SwapFile>(dir, name, total);
  entry_ = LedgerEntry(ledger, Tier::Nvme, kind, total);
}

int64_t Swapper::io_bytes(size_t region) const {
  return aligned(bytes_.at(region));
}

std::future<void> Swapper::write(size_t region, const void* source) {
  return io_->write(file_->file(), source, io_bytes(region), offsets_.at(region));
}

std::future<void> Swapper::read(size_t region, void* destination) {
  return io_->read(file_->file(), destination, io_bytes(region), offsets_.at(region));
}

void Swapper::update_each(const std::vector<size_t>& order, PinnedPool& pool,
                          const std::function<void(size_t, void*)>& update, Pass pass) {
  struct Transfer {
    size_t position;
    int64_t slot;
    std::future<void> done;
  };
  for (size_t r : order) {
    if (io_bytes(r) > pool.bytes_each()) {
      fail("swap region {} of {} ({} bytes) does not fit a pinned buffer of {} bytes", r,
           file().path, io_bytes(r), pool.bytes_each());
    }
  }
  std::vector<int64_t> free_slots;
  for (int64_t i = 0; i < pool.count(); ++i) free_slots.push_back(pool.acquire());
  std::deque<Transfer> reads, writes;
  const size_t ahead = std::max<size_t>(1, free_slots.size() - 1);  // one slot left for compute
  auto take_slot = [&] {
    if (free_slots.empty()) {
      Transfer w = std::move(writes.front());
      writes.pop_front();
      free_slots.push_back(w.slot);
      w.done.get();
    }
    const int64_t slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  };
  // Writes that have ended give their slots back without waiting: waiting here for the
  // write just issued would keep the next update from overlapping it (measured before:
  // step = I/O + Adam, 1.16-1.92x max(I/O, Adam) in `zs bench swap`).
  auto recycle_written = [&] {
    while (!writes.empty() &&
           writes.front().done.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      Transfer w = std::move(writes.front());
      writes.pop_front();
      free_slots.push_back(w.slot);
      w.done.get();
    }
  };
  auto finish_all = [&] {  // every transfer in flight ends before buffers are given back
    std::exception_ptr first;
    for (auto* q : {&reads, &writes}) {
      for (auto& t : *q) {
        try {
          t.done.get();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
        free_slots.push_back(t.slot);
      }
      q->clear();
    }
    for (int64_t s : free_slots) pool.release(s);
    free_slots.clear();
    if (first) std::rethrow_exception(first);
  };
  SwapPassTimes times;
  try {
    size_t next = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      recycle_written();
      // Read ahead into free slots; wait for a write only when region i is not yet read.
      while (next < order.size() && reads.size() < ahead &&
             (!free_slots.empty() || reads.empty())) {
        const int64_t slot = take_slot();
        reads.push_back(
            {next, slot, pass == Pass::Fill ? done_now() : read(order[next], pool.buffer(slot))});
        ++next;
      }
      Transfer t = std::move(reads.front());
      reads.pop_front();
      writes.push_back({t.position, t.slot, {}});  // owns the slot from here on
      timed(&times.waiting_for_reads, [&] { t.done.get(); });
      timed(&times.updating, [&] { update(order[i], pool.buffer(t.slot)); });
      writes.back().done = pass == Pass::Drain ? done_now() : write(order[i], pool.buffer(t.slot));
    }
  } catch (...) {
    for (auto* q : {&reads, &writes}) {
      for (auto& t : *q) {
        if (!t.done.valid()) t.done = done_now();
      }
    }
    try {
      finish_all();
    } catch (...) {
    }
    throw;
  }
  timed(&times.draining, finish_all);
  last_pass_ = times;
}

}  // namespace zeroshard
