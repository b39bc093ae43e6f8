// PagedState: a group's state arrays written to its swap regions come back whole, and
// what an update leaves in a region's buffer is what the next pass reads.
#include "optim/PagedState.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/Error.h"
#include "offload/IoEngine.h"
#include "offload/SwapFile.h"
#include "tests/offload/Scratch.h"

using namespace zeroshard;
using namespace zeroshard::testing;

TEST(PagedState, RegionsCutEachGroupAndKeepWhatTheUpdatesLeave) {
  SwapDir dir(scratch_dir("paged-state"), "two-arrays");
  IoEngine io(IoOptions{});
  MemoryLedger ledger;
  ExternalStateSwap swap;
  swap.io = &io;
  swap.dir = dir.path();
  swap.sub_group_numel = 3;
  swap.buffer_count = 2;
  PagedState paged(swap);
  paged.add_group(0, 7);  // regions of 3, 3 and 1
  paged.add_group(1, 2);
  ASSERT_EQ(paged.regions().size(), 4u);
  EXPECT_EQ(paged.regions()[2].offset, 6);
  EXPECT_EQ(paged.regions()[2].numel, 1);
  EXPECT_EQ(paged.regions()[3].group, 1u);
  paged.open(2, &ledger);
  EXPECT_EQ(ledger.current(Tier::Nvme, Kind::OptimizerStates), 2 * 4 * 9);
  const at::Tensor a = at::arange(7, at::kFloat), b = -at::arange(7, at::kFloat);
  paged.fill(0, {a.data_ptr<float>(), b.data_ptr<float>()});
  paged.fill(1, {at::ones({2}).data_ptr<float>(), at::ones({2}).data_ptr<float>()});
  paged.update_all([](size_t, const std::vector<at::Tensor>& arrays) {
    arrays[0].add_(arrays[1]).mul_(2);  // array 0 = 2 (a + b)
  });
  at::Tensor got_a = at::empty({7}), got_b = at::empty({7});
  paged.drain(0, {got_a.data_ptr<float>(), got_b.data_ptr<float>()});
  EXPECT_TRUE(at::equal(got_a, at::zeros({7})));
  EXPECT_TRUE(at::equal(got_b, b));
  at::Tensor ones_a = at::empty({2}), ones_b = at::empty({2});
  paged.drain(1, {ones_a.data_ptr<float>(), ones_b.data_ptr<float>()});
  EXPECT_TRUE(at::equal(ones_a, at::full({2}, 4.0)));
}

TEST(PagedState, ASubGroupSizeBelowOneIsRefusedByName) {
  ExternalStateSwap swap;
  swap.sub_group_numel = 0;
  try {
    PagedState paged(swap);
    FAIL() << "sub_group_size 0 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.sub_group_size: 0 is not allowed"),
              std::string::npos)
        << e.what();
  }
}
