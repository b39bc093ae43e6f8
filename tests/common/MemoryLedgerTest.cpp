#include "common/MemoryLedger.h"

#include <gtest/gtest.h>

using namespace zeroshard;

TEST(MemoryLedger, EntriesCountWhileTheyLiveAndPeaksStay) {
  MemoryLedger ledger;
  {
    LedgerEntry a(&ledger, Tier::Device, Kind::Params, 100);
    LedgerEntry b(&ledger, Tier::Device, Kind::Grads, 50);
    EXPECT_EQ(ledger.snapshot().current_total(Tier::Device), 150);
    b.resize(0);  // a stage-3 buffer freed
    EXPECT_EQ(ledger.current(Tier::Device, Kind::Grads), 0);
    b.resize(70);
    LedgerEntry moved = std::move(a);
    EXPECT_EQ(ledger.current(Tier::Device, Kind::Params), 100);
  }
  const LedgerSnapshot s = ledger.snapshot();
  EXPECT_EQ(s.current_total(Tier::Device), 0);
  EXPECT_EQ(s.peak[0][static_cast<size_t>(Kind::Grads)], 70);
  EXPECT_EQ(s.peak_total(Tier::Device), 170);
  ledger.reset_peaks();
  EXPECT_EQ(ledger.snapshot().peak_total(Tier::Device), 0);
}
