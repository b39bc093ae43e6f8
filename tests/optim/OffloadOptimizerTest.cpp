// OffloadOptimizer's I/O pass (bench swap's reference): it reads every sub-group and
// writes it back unchanged, so the state, and every step after it, is what it would
// have been without the pass.
#include "optim/OffloadOptimizer.h"

#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/Error.h"
#include "common/MemoryLedger.h"
#include "offload/IoEngine.h"
#include "offload/SwapFile.h"
#include "tests/offload/Scratch.h"

using namespace zeroshard;
using namespace zeroshard::testing;

namespace {

struct State {
  at::Tensor master, m, v;
};

State read_all(OffloadOptimizer& o, int64_t n) {
  State s{at::empty({n}), at::empty({n}), at::empty({n})};
  o.read_state(0, s.master.data_ptr<float>(), s.m.data_ptr<float>(), s.v.data_ptr<float>());
  return s;
}

TEST(OffloadOptimizer, AnIoPassLeavesTheStateAndTheNextStepAsTheyWere) {
  const std::string dir = scratch_dir("io-pass");
  SwapDir swap_with(dir, "with"), swap_without(dir, "without");
  IoEngine io(IoOptions{});
  MemoryLedger ledger;
  const int64_t n = 10'000;  // three sub-groups, the last one short
  at::manual_seed(3);
  const at::Tensor start = at::randn({n});
  OffloadOptimizerOptions options;
  options.device = OffloadDevice::Nvme;
  options.sub_group_numel = 4'000;
  options.buffer_count = 2;
  options.io = &io;
  options.swap_dir = swap_with.path();
  at::Tensor with_shard = start.clone(), without_shard = start.clone();
  OffloadOptimizer with(options, &ledger);
  with.add_group(with_shard);
  options.swap_dir = swap_without.path();
  OffloadOptimizer without(options, &ledger);
  without.add_group(without_shard);
  AdamHyper h;
  h.weight_decay = 0.1;
  for (int step = 0; step < 2; ++step) {
    const at::Tensor grad = at::randn({n});
    with.step({grad}, 1.0, h);
    without.step({grad}, 1.0, h);
    with.io_pass();
    with.io_pass();
    const State a = read_all(with, n), b = read_all(without, n);
    EXPECT_TRUE(at::equal(a.master, b.master)) << "step " << step;
    EXPECT_TRUE(at::equal(a.m, b.m)) << "step " << step;
    EXPECT_TRUE(at::equal(a.v, b.v)) << "step " << step;
    EXPECT_GT(a.v.abs().sum().item<double>(), 0.0);  // the state is not trivially equal
  }
  EXPECT_TRUE(at::equal(with_shard, without_shard));
  EXPECT_FALSE(at::equal(with_shard, start));
}

TEST(OffloadOptimizer, AnIoPassNeedsTheStateOnNvme) {
  MemoryLedger ledger;
  OffloadOptimizer host(OffloadOptimizerOptions{}, &ledger);
  host.add_group(at::zeros({16}));
  try {
    host.io_pass();
    FAIL() << "io_pass ran with the state in host RAM";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in host RAM, not on NVMe"), std::string::npos)
        << e.what();
  }
}

}  // namespace
