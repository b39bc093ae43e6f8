// Swapper: regions round-trip, the pipelined update touches every region exactly once
// whatever the buffer count, a failed read writes nothing back, and a pass says where
// its time went.
#include "offload/Swapper.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "tests/offload/Scratch.h"

#include "common/Error.h"

using namespace zeroshard;
using zeroshard::testing::scratch_dir;
namespace fs = std::filesystem;

namespace {

// Regions of uneven sizes (in floats), none a multiple of the I/O alignment.
const std::vector<int64_t> kFloats{1000, 70'001, 3, 40'000, 65'536};

std::vector<int64_t> region_bytes() {
  std::vector<int64_t> b;
  for (int64_t n : kFloats) b.push_back(n * 4);
  return b;
}

class UpdateEach : public ::testing::TestWithParam<int> {};

TEST_P(UpdateEach, EveryRegionUpdatedOnceAndWrittenBack) {
  const std::string dir = scratch_dir("update" + std::to_string(GetParam()));
  SwapDir swap(dir, "test");
  IoOptions o;
  o.block_size = 64 << 10;
  IoEngine io(o);
  MemoryLedger ledger;
  Swapper swapper(&io, swap.path(), "opt", region_bytes(), &ledger, Kind::OptimizerStates);
  EXPECT_GE(ledger.current(Tier::Nvme, Kind::OptimizerStates), 4 * 176'540);
  PinnedPool pool(GetParam(), 70'001 * 4, &ledger);
  for (size_t r = 0; r < kFloats.size(); ++r) {  // region r holds r, r+1, r+2, ...
    auto* f = static_cast<float*>(pool.buffer(0));
    std::iota(f, f + kFloats[r], static_cast<float>(r));
    swapper.write(r, f).get();
  }
  std::vector<int> seen(kFloats.size(), 0);
  const std::vector<size_t> order{4, 0, 1, 2, 3};
  for (int pass = 0; pass < 2; ++pass) {
    swapper.update_each(order, pool, [&](size_t r, void* buffer) {
      ++seen[r];
      auto* f = static_cast<float*>(buffer);
      for (int64_t i = 0; i < kFloats[r]; ++i) f[i] *= 2;
    });
  }
  for (size_t r = 0; r < kFloats.size(); ++r) {
    EXPECT_EQ(seen[r], 2);
    auto* f = static_cast<float*>(pool.buffer(0));
    swapper.read(r, f).get();
    for (int64_t i = 0; i < kFloats[r]; i += 997) ASSERT_EQ(f[i], 4.0f * (r + i)) << r << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(BufferCounts, UpdateEach, ::testing::Values(1, 2, 3, 5));

TEST(Swapper, AFailedReadIsNeverWrittenBack) {
  const std::string dir = scratch_dir("failed-read");
  SwapDir swap(dir, "test");
  IoEngine io(IoOptions{});
  MemoryLedger ledger;
  Swapper swapper(&io, swap.path(), "opt", region_bytes(), &ledger, Kind::OptimizerStates);
  PinnedPool pool(3, 70'001 * 4, &ledger);
  auto* f = static_cast<float*>(pool.buffer(0));
  for (size_t r = 0; r < kFloats.size(); ++r) {
    std::fill(f, f + kFloats[r], 1.0f);
    swapper.write(r, f).get();
  }
  std::atomic<int> writes_of_region1{0};
  const int64_t region1_offset = 4096;  // region 0 (4000 bytes) padded to 4096
  io.set_completion_hook([&](IoOp op, const IoFile&, int64_t offset, int64_t, int result) {
    if (offset == region1_offset && op == IoOp::Read) return -EIO;
    if (offset == region1_offset && op == IoOp::Write) ++writes_of_region1;
    return result;
  });
  int updated = 0;
  EXPECT_THROW(swapper.update_each({0, 1, 2, 3, 4}, pool, [&](size_t, void*) { ++updated; }),
               Error);
  EXPECT_EQ(writes_of_region1.load(), 0);
  EXPECT_EQ(updated, 1);  // region 0 only; the pipeline stopped at the failed read
  io.set_completion_hook({});
  // The pool is whole again and the swap file still usable.
  swapper.update_each({0, 1, 2, 3, 4}, pool, [&](size_t, void*) {});
}

// Reads, updates and the last write are each held up by a known delay; the pass's
// times must hold at least that much of each, and together no more than its wall time.
TEST(Swapper, APassSaysWhereItsTimeWent) {
  using namespace std::chrono;
  const std::string dir = scratch_dir("pass-times");
  SwapDir swap(dir, "test");
  IoEngine io(IoOptions{});
  MemoryLedger ledger;
  Swapper swapper(&io, swap.path(), "opt", region_bytes(), &ledger, Kind::OptimizerStates);
  EXPECT_EQ(swapper.last_pass().updating, 0.0);
  PinnedPool pool(2, 70'001 * 4, &ledger);
  const int64_t last_offset =
      swapper.io_bytes(0) + swapper.io_bytes(1) + swapper.io_bytes(2) + swapper.io_bytes(3);
  io.set_completion_hook([&](IoOp op, const IoFile&, int64_t offset, int64_t, int result) {
    if (op == IoOp::Read && offset == 0) std::this_thread::sleep_for(milliseconds(60));
    if (op == IoOp::Write && offset == last_offset) std::this_thread::sleep_for(milliseconds(60));
    return result;
  });
  const auto start = steady_clock::now();
  swapper.update_each({0, 1, 2, 3, 4}, pool,
                      [](size_t, void*) { std::this_thread::sleep_for(milliseconds(20)); });
  const double wall = duration<double>(steady_clock::now() - start).count();
  io.set_completion_hook({});
  const SwapPassTimes& t = swapper.last_pass();
  EXPECT_GE(t.waiting_for_reads, 0.055);  // region 0's read, nothing to overlap it
  EXPECT_GE(t.updating, 5 * 0.019);
  EXPECT_GE(t.draining, 0.055 - 0.020);  // region 4's write; at most one update overlaps it
  EXPECT_LE(t.waiting_for_reads + t.updating + t.draining, wall);
}

}  // namespace
