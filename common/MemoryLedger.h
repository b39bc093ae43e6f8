#pragma once
// Counts the bytes zeroshard really holds, per tier and kind, current and peak.
// Every buffer sharding/ and offload/ allocate is registered through a LedgerEntry,
// which releases its bytes when it is destroyed, so the count cannot drift from the
// buffers' lifetimes. Thread-safe.
#include <array>
#include <cstdint>
#include <mutex>

#include "common/MemoryKinds.h"

namespace zeroshard {

struct LedgerSnapshot {
  std::array<std::array<int64_t, kNumKinds>, kNumTiers> current{};
  std::array<std::array<int64_t, kNumKinds>, kNumTiers> peak{};
  int64_t current_total(Tier t) const;
  int64_t peak_total(Tier t) const;  // peak of the tier's sum, not a sum of peaks
  std::array<int64_t, kNumTiers> tier_peaks{};
};

class MemoryLedger {
 public:
  void add(Tier tier, Kind kind, int64_t bytes);
  void remove(Tier tier, Kind kind, int64_t bytes);
  void reset_peaks();
  LedgerSnapshot snapshot() const;
  int64_t current(Tier tier, Kind kind) const;

 private:
  mutable std::mutex mutex_;
  LedgerSnapshot state_;
};

// One registered buffer. Movable, not copyable; resize() follows a buffer that grows
// or shrinks (a stage-3 unit freed to 0 bytes and gathered again).
class LedgerEntry {
 public:
  LedgerEntry() = default;
  LedgerEntry(MemoryLedger* ledger, Tier tier, Kind kind, int64_t bytes);
  LedgerEntry(LedgerEntry&& other) noexcept;
  LedgerEntry& operator=(LedgerEntry&& other) noexcept;
  LedgerEntry(const LedgerEntry&) = delete;
  LedgerEntry& operator=(const LedgerEntry&) = delete;
  ~LedgerEntry();

  void resize(int64_t bytes);
  int64_t bytes() const { return bytes_; }

 private:
  void release();
  MemoryLedger* ledger_ = nullptr;
  Tier tier_ = Tier::Device;
  Kind kind_ = Kind::Params;
  int64_t bytes_ = 0;
};

}  // namespace zeroshard
