// ExternalOptimizer: the hooks step the fp32 masters, the engine's side keeps what it
// keeps for its own Adam: the compute-precision shard follows the master, the state is
// counted in the ledger, and checkpoints read and write it as named arrays.
#include "engine/ExternalOptimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/Error.h"

using namespace zeroshard;

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
