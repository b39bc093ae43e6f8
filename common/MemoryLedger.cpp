#include "common/MemoryLedger.h"

#include <algorithm>
#include <utility>

namespace zeroshard {

int64_t LedgerSnapshot::current_total(Tier t) const {
  int64_t sum = 0;
  for (int64_t v : current[static_cast<size_t>(t)]) sum += v;
  return sum;
}

int64_t LedgerSnapshot::peak_total(Tier t) const { return tier_peaks[static_cast<size_t>(t)]; }

void MemoryLedger::add(Tier tier, Kind kind, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t = static_cast<size_t>(tier);
  const auto k = static_cast<size_t>(kind);
  state_.current[t][k] += bytes;
  state_.peak[t][k] = std::max(state_.peak[t][k], state_.current[t][k]);
  state_.tier_peaks[t] = std::max(state_.tier_peaks[t], state_.current_total(tier));
}

void MemoryLedger::remove(Tier tier, Kind kind, int64_t bytes) { add(tier, kind, -bytes); }

void MemoryLedger::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.peak = state_.current;
  for (size_t t = 0; t < kNumTiers; ++t) {
    state_.tier_peaks[t] = state_.current_total(static_cast<Tier>(t));
  }
}

LedgerSnapshot MemoryLedger::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

int64_t MemoryLedger::current(Tier tier, Kind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_.current[static_cast<size_t>(tier)][static_cast<size_t>(kind)];
}

LedgerEntry::LedgerEntry(MemoryLedger* ledger, Tier tier, Kind kind, int64_t bytes)
    : ledger_(ledger), tier_(tier), kind_(kind), bytes_(bytes) {
  if (ledger_ != nullptr) ledger_->add(tier_, kind_, bytes_);
}

LedgerEntry::LedgerEntry(LedgerEntry&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)),
      tier_(other.tier_),
      kind_(other.kind_),
      bytes_(std::exchange(other.bytes_, 0)) {}

LedgerEntry& LedgerEntry::operator=(LedgerEntry&& other) noexcept {
  if (this != &other) {
    release();
    ledger_ = std::exchange(other.ledger_, nullptr);
    tier_ = other.tier_;
    kind_ = other.kind_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

LedgerEntry::~LedgerEntry() { release(); }

void LedgerEntry::resize(int64_t bytes) {
  if (ledger_ != nullptr) ledger_->add(tier_, kind_, bytes - bytes_);
  bytes_ = bytes;
}

void LedgerEntry::release() {
  if (ledger_ != nullptr) ledger_->remove(tier_, kind_, bytes_);
  ledger_ = nullptr;
  bytes_ = 0;
}

}  // namespace zeroshard
