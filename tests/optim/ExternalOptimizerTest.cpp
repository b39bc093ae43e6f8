// ExternalOptimizer: the hooks step the fp32 masters, the engine's side keeps what it
// keeps for its own Adam: the compute-precision shard follows the master, the state is
// counted in the ledger, and checkpoints read and write it as named arrays.
#include "optim/ExternalOptimizer.h"

#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/Error.h"
#include "offload/IoEngine.h"
#include "offload/SwapFile.h"
#include "tests/offload/Scratch.h"

using namespace zeroshard;
using namespace zeroshard::testing;

namespace {

// SGD with momentum over whole groups (the hooks' owner is usually torch.optim from
// Python); its momentum buffers are the state, "momentum_buffer" as torch names it.
struct Momentum {
  std::vector<at::Tensor> masters, buffers;
  ExternalOptimizerHooks hooks() {
    ExternalOptimizerHooks h;
    h.step = [this](const std::vector<at::Tensor>& grads, const std::vector<AdamHyper>& hypers) {
      for (size_t i = 0; i < grads.size(); ++i) {
        buffers[i].mul_(0.9).add_(grads[i]);
        masters[i].add_(buffers[i], -hypers[0].lr);
      }
    };
    h.state_names = [] { return std::vector<std::string>{"momentum_buffer"}; };
    h.read_state = [this](size_t g, const std::vector<at::Tensor>& a) { a[0].copy_(buffers[g]); };
    h.write_state = [this](size_t g, const std::vector<at::Tensor>& a) { buffers[g].copy_(a[0]); };
    h.scalar_state = [] { return std::string("null"); };
    h.set_scalar_state = [](const std::string&, int64_t) {};
    h.state_bytes = [this] {
      int64_t n = 0;
      for (const auto& b : buffers) n += b.nbytes();
      return n;
    };
    return h;
  }
};

}  // namespace

TEST(ExternalOptimizer, TheHooksStepTheMasterAndTheBf16ShardFollows) {
  MemoryLedger ledger;
  at::Tensor shard = at::full({6}, 1.0, at::kBFloat16);
  ExternalOptimizer opt("SGD", Tier::Device, &ledger);
  opt.add_group(shard);
  EXPECT_EQ(ledger.current(Tier::Device, Kind::MasterParams), 6 * 4);  // an fp32 copy
  Momentum sgd{{opt.masters()[0]}, {at::zeros({6})}};
  opt.set_hooks(sgd.hooks());
  EXPECT_EQ(ledger.current(Tier::Device, Kind::OptimizerStates), 6 * 4);
  AdamHyper h;
  h.lr = 0.5;
  opt.step({at::full({6}, 4.0)}, /*grad_scale=*/0.25, h);  // the gradient's mean: 1
  opt.step({at::full({6}, 4.0)}, 0.25, h);
  // 1 - 0.5 * 1, then - 0.5 * 1.9
  EXPECT_TRUE(at::allclose(opt.masters()[0], at::full({6}, -0.45)));
  EXPECT_TRUE(at::equal(shard, at::full({6}, -0.45).to(at::kBFloat16)));
  EXPECT_EQ(opt.steps(), 2);

  std::vector<float> master(6), momentum(6);
  opt.read_state(0, std::vector<float*>{master.data(), momentum.data()});
  EXPECT_FLOAT_EQ(momentum[0], 1.9f);
  EXPECT_FLOAT_EQ(master[0], -0.45f);
  const std::vector<float> saved_master(6, 2.0f), saved_momentum(6, 0.5f);
  opt.write_state(0, {"momentum_buffer"},
                  std::vector<const float*>{saved_master.data(), saved_momentum.data()});
  EXPECT_TRUE(at::equal(shard, at::full({6}, 2.0, at::kBFloat16)));
  EXPECT_TRUE(at::equal(sgd.buffers[0], at::full({6}, 0.5)));
  try {
    opt.write_state(
        0, {"exp_avg", "exp_avg_sq"},
        std::vector<const float*>{saved_master.data(), saved_master.data(), saved_master.data()});
    FAIL() << "Adam's state was taken by SGD";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds optimizer state [exp_avg, exp_avg_sq], but this "
                                         "engine's optimizer (SGD) keeps [momentum_buffer]"),
              std::string::npos)
        << e.what();
  }
}

TEST(ExternalOptimizer, WithoutHooksAStepSaysWhoStepsIt) {
  MemoryLedger ledger;
  at::Tensor shard = at::zeros({4});
  ExternalOptimizer opt("Adagrad", Tier::Device, &ledger);
  opt.add_group(shard);
  EXPECT_EQ(opt.masters()[0].data_ptr(), shard.data_ptr());  // fp32: the shard is the master
  try {
    opt.step({at::zeros({4})}, 1.0, AdamHyper{});
    FAIL() << "stepped without hooks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.type 'Adagrad' is a torch.optim class, which "
                                         "the Python package steps"),
              std::string::npos)
        << e.what();
  }
}

namespace {

// The same SGD with momentum, one swap region at a time, keeping no state of its own:
// the engine hands it each region's momentum buffer (what Python's TorchShardOptimizer
// does with NVMe).
ExternalOptimizerHooks paged_momentum(ExternalOptimizer& opt, std::vector<at::Tensor>& initial) {
  ExternalOptimizerHooks h;
  h.step = [](const std::vector<at::Tensor>&, const std::vector<AdamHyper>&) {
    FAIL() << "stepped all groups at once";
  };
  h.state_names = [] { return std::vector<std::string>{"momentum_buffer"}; };
  h.scalar_state = [] { return std::string("null"); };
  h.set_scalar_state = [](const std::string&, int64_t) {};
  h.read_state = [&initial](size_t g, const std::vector<at::Tensor>& a) { a[0].copy_(initial[g]); };
  h.write_state = [](size_t, const std::vector<at::Tensor>&) {};
  h.state_bytes = [] { return int64_t{0}; };
  h.release_state = [&initial] { initial.clear(); };
  h.step_region = [&opt](size_t r, const at::Tensor& grad, const std::vector<AdamHyper>& hypers,
                         const std::vector<at::Tensor>& arrays) {
    const StateRegion& region = opt.regions().at(r);
    arrays[0].mul_(0.9).add_(grad.narrow(0, region.offset, region.numel));
    opt.masters()[region.group]
        .narrow(0, region.offset, region.numel)
        .add_(arrays[0], -hypers[0].lr);
  };
  return h;
}

}  // namespace

TEST(ExternalOptimizer, OnNvmeTheStateIsPagedRegionByRegionAndSteppedAsInMemory) {
  const std::string dir = scratch_dir("external-nvme");
  SwapDir swap_dir(dir, "sgd");
  IoEngine io(IoOptions{});
  MemoryLedger ledger;
  const int64_t n = 10'000;  // three regions, the last one short
  at::manual_seed(5);
  const at::Tensor start = at::randn({n}), first_momentum = at::randn({n});
  ExternalStateSwap swap;
  swap.io = &io;
  swap.dir = swap_dir.path();
  swap.sub_group_numel = 4'000;
  swap.buffer_count = 2;
  at::Tensor paged_shard = start.clone(), memory_shard = start.clone();
  ExternalOptimizer paged("SGD", Tier::Host, &ledger, swap);
  paged.add_group(paged_shard);
  ASSERT_EQ(paged.regions().size(), 3u);
  std::vector<at::Tensor> initial{first_momentum.clone()};  // a constructor's state
  paged.set_hooks(paged_momentum(paged, initial));
  EXPECT_TRUE(initial.empty());  // the hooks dropped theirs
  EXPECT_EQ(ledger.current(Tier::Nvme, Kind::OptimizerStates), 4 * n);
  EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 2 * 16'384);  // 4,000 x 4, aligned

  MemoryLedger other;
  ExternalOptimizer memory("SGD", Tier::Host, &other);
  memory.add_group(memory_shard);
  Momentum sgd{{memory.masters()[0]}, {first_momentum.clone()}};
  memory.set_hooks(sgd.hooks());
  AdamHyper h;
  h.lr = 0.1;
  for (int step = 0; step < 3; ++step) {
    const at::Tensor grad = at::randn({n});
    paged.step({grad.clone()}, 0.5, h);
    memory.step({grad.clone()}, 0.5, h);
  }
  EXPECT_TRUE(at::equal(paged_shard, memory_shard));
  EXPECT_FALSE(at::equal(paged_shard, start));
  // Checkpoints read and write the regions.
  at::Tensor master = at::empty({n}), momentum = at::empty({n});
  paged.read_state(0, std::vector<float*>{master.data_ptr<float>(), momentum.data_ptr<float>()});
  EXPECT_TRUE(at::equal(momentum, sgd.buffers[0]));
  const at::Tensor saved = at::full({n}, 0.25);
  paged.write_state(0, {"momentum_buffer"},
                    std::vector<const float*>{master.data_ptr<float>(), saved.data_ptr<float>()});
  paged.read_state(0, std::vector<float*>{master.data_ptr<float>(), momentum.data_ptr<float>()});
  EXPECT_TRUE(at::equal(momentum, saved));
}

TEST(ExternalOptimizer, OnNvmeAnOptimizerThatStepsOnlyWholeParametersIsRefused) {
  const std::string dir = scratch_dir("external-nvme-refused");
  SwapDir swap_dir(dir, "adafactor");
  IoEngine io(IoOptions{});
  MemoryLedger ledger;
  ExternalStateSwap swap;
  swap.io = &io;
  swap.dir = swap_dir.path();
  ExternalOptimizer opt("Adafactor", Tier::Host, &ledger, swap);
  opt.add_group(at::zeros({16}));
  Momentum whole{{opt.masters()[0]}, {at::zeros({16})}};
  try {
    opt.set_hooks(whole.hooks());  // no step_region
    FAIL() << "paged an optimizer that steps whole parameters";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nvme' with optimizer Adafactor, whose update needs "
                                         "every group's whole parameters in one step"),
              std::string::npos)
        << e.what();
  }
}
