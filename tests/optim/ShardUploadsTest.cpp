// The updated shards' staging (optim/ShardUploads.h), on the host: there every copy is
// synchronous, so what is checked is the slots' bookkeeping; on a GPU the copies and
// their events run in EngineOffload.GpuOptimizerOffloadEndsWhereTheDeviceOptimizerDoes.
#include "optim/ShardUploads.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

// Two slots of exactly what was reserved (aligned as every pinned buffer is), counted
// once for as long as they live, however many parts go through them; the slots take
// turns; a part is copied whole into its destination.
TEST(ShardUploads, TwoSlotsOfTheLargestPartCountedOnceForEveryPart) {
  MemoryLedger ledger;
  {
    ShardUploads uploads(c10::Device(at::kCPU), &ledger, /*page_lock=*/false);
    EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 0);
    uploads.reserve(3000 * 2);  // 3,000 bf16 elements: 6,000 bytes, aligned to 8,192
    EXPECT_EQ(uploads.slot_bytes(), 8192);
    EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 2 * 8192);
    at::Tensor shard = at::zeros({3000}, at::kBFloat16);
    std::vector<void*> slots;
    for (int part = 0; part < 100; ++part) {
      const int64_t count = part % 2 == 0 ? 3000 : 1000;
      at::Tensor staging = uploads.staging(at::kBFloat16, count);
      slots.push_back(staging.data_ptr());
      staging.fill_(part);
      uploads.upload(shard.narrow(0, 0, count), staging);
      EXPECT_EQ(shard[count - 1].item<float>(), part);
    }
    uploads.wait_all();
    uploads.order_before_current();
    EXPECT_NE(slots[0], slots[1]);
    for (size_t i = 2; i < slots.size(); ++i) EXPECT_EQ(slots[i], slots[i - 2]);
    EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 2 * 8192);
  }
  EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 0);
}

TEST(ShardUploads, APartLargerThanTheSlotsIsRefusedNamingBoth) {
  MemoryLedger ledger;
  ShardUploads uploads(c10::Device(at::kCPU), &ledger, /*page_lock=*/false);
  uploads.reserve(4096);
  try {
    uploads.staging(at::kFloat, 2000);
    FAIL() << "an 8,000-byte part was given a 4,096-byte slot";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a part of 8000 bytes does not fit the staging slots "
                                         "of 4096 bytes"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zeroshard
