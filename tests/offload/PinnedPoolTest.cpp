// PinnedPool: buffers aligned for O_DIRECT and counted in the ledger; buffers of a huge
// page or more start on one and are marked for transparent huge pages.
#include "offload/PinnedPool.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/Alignment.h"

using namespace zeroshard;

namespace {

// The kernel's transparent huge page mode: "always", "madvise" or "never" ("" if unknown).
std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

// /proc/self/smaps' THPeligible for the mapping that holds `address` (-1 if not found).
int thp_eligible(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= at && at < end;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

TEST(PinnedPool, SmallBuffersAreAlignedForDirectIoAndCounted) {
  MemoryLedger ledger;
  {
    PinnedPool pool(3, 70'001 * 4, &ledger);
    ASSERT_EQ(pool.count(), 3);
    EXPECT_EQ(pool.bytes_each(), round_up(70'001 * 4, kIoAlignment));
    for (int64_t i = 0; i < pool.count(); ++i)
      EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.buffer(i)) % kIoAlignment, 0u) << i;
    EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 3 * pool.bytes_each());
  }
  EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 0);
}

// The buffer's whole huge pages are marked (THPeligible 1) and its bytes are what the
// ledger counts: the tail past the last whole huge page is not rounded up.
TEST(PinnedPool, LargeBuffersStartOnAHugePageAndAskForHugePages) {
  const std::string mode = thp_mode();
  if (mode != "madvise" && mode != "always") {
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' on this kernel";
  }
  MemoryLedger ledger;
  const int64_t bytes = 3 * kHugePageBytes + 5 * kIoAlignment;
  PinnedPool pool(2, bytes, &ledger);
  EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 2 * bytes);
  for (int64_t i = 0; i < pool.count(); ++i) {
    auto* p = static_cast<char*>(pool.buffer(i));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u) << i;
    std::memset(p, 1, static_cast<size_t>(bytes));  // every byte is usable
    EXPECT_EQ(thp_eligible(p), 1) << "buffer " << i << " (THP mode " << mode << ")";
    EXPECT_EQ(thp_eligible(p + 3 * kHugePageBytes - 1), 1) << i;
  }
}

}  // namespace
