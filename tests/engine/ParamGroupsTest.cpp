// Parameter groups: which group each element of a shard steps with (checked element by
// element against the slots), and the optimizers stepping a shard span by span against
// torch's own AdamW with the same two groups.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/Error.h"
#include "optim/OffloadOptimizer.h"
#include "engine/ParamGroups.h"
#include "plan/TrainingSettings.h"
#include "optim/ResidentOptimizer.h"

using namespace zeroshard;

namespace {

// a (3) and c (2) decay, b (5) does not: interleaved, as a block's weights and biases are.
struct ThreeParams {
  at::Tensor a = at::randn({3}).requires_grad_(), b = at::randn({5}).requires_grad_(),
             c = at::randn({2}).requires_grad_();
  std::vector<NamedParam> named() const { return {{"a", a}, {"b", b}, {"c", c}}; }
  std::vector<ParamGroup> groups() const {
    ParamGroupOptions no_decay;
    no_decay.weight_decay = 0.0;
    no_decay.lr = 0.05;
    no_decay.beta1 = 0.8;
    no_decay.eps = 1e-6;
    return {{{a, c}, {}}, {{b}, no_decay}};
  }
};

// The group of flat element e: the slot holding it, else the last slot before it.
size_t group_by_slots(const FlatParamGroup& g, int64_t e) {
  size_t group = 0;
  for (const auto& slot : g.slots()) {
    if (slot.offset <= e) group = slot.name == "b" ? 1 : 0;
  }
  return group;
}

}  // namespace

TEST(ParamGroups, SpansGiveEveryShardElementItsParametersGroup) {
  ThreeParams p;
  const ParamGroupTable table(p.groups(), p.named());
  for (int world : {1, 2, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      FlatParamGroup g(p.named(), rank, world, at::kFloat, false, true, false, nullptr);
      const int64_t begin = rank * g.shard_numel();
      const auto spans = table.spans(g, begin, g.shard_numel());
      int64_t covered = 0;
      for (const auto& s : spans) {
        EXPECT_EQ(s.begin, covered) << "spans leave a gap";
        for (int64_t i = s.begin; i < s.begin + s.count; ++i)
          EXPECT_EQ(s.group, group_by_slots(g, begin + i)) << "world " << world << " element " << i;
        covered += s.count;
      }
      EXPECT_EQ(covered, g.shard_numel()) << "world " << world << " rank " << rank;
    }
  }
}

TEST(ParamGroups, RefusalsNameTheParameterAndTheGroups) {
  ThreeParams p;
  auto expect_error = [&](std::vector<ParamGroup> groups, const std::string& want) {
    try {
      ParamGroupTable table(std::move(groups), p.named());
      ADD_FAILURE() << "no error, wanted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error({{{p.a, p.b}, {}}, {{p.b, p.c}, {}}},
               "parameter 'b' is in param_groups[0] and param_groups[1]");
  expect_error({{{p.a, p.b}, {}}}, "1 trainable parameter(s) are in no parameter group: c");
  expect_error({{{p.a, p.b, p.c, at::zeros({4})}, {}}},
               "param_groups[0] holds a tensor of shape [4] that is not a parameter");
  ParamGroupOptions bad;
  bad.beta2 = 1.0;
  expect_error({{{p.a, p.b, p.c}, bad}}, "param_groups[0].betas[1]: 1 is not allowed");
}

// Five AdamW steps of the three parameters flattened into one shard, stepped by
// `optimizer` with the table's spans, against torch::optim::AdamW with the two groups.
void expect_matches_torch(ShardOptimizer& optimizer) {
  torch::manual_seed(0);
  ThreeParams p;
  OptimizerConfig config;  // AdamW, lr 1e-3, weight_decay 0.01
  config.weight_decay = 0.1;
  const ParamGroupTable table(p.groups(), p.named());
  std::vector<at::Tensor> reference;
  for (const auto& t : {p.a, p.b, p.c}) reference.push_back(t.detach().clone().requires_grad_());
  std::vector<torch::optim::OptimizerParamGroup> torch_groups;
  torch_groups.emplace_back(std::vector<at::Tensor>{reference[0], reference[2]},
                            std::make_unique<torch::optim::AdamWOptions>(
                                torch::optim::AdamWOptions(1e-3).weight_decay(0.1)));
  torch_groups.emplace_back(
      std::vector<at::Tensor>{reference[1]},
      std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(0.05).betas({0.8, 0.999}).eps(1e-6).weight_decay(0.0)));
  torch::optim::AdamW torch_adamw(torch_groups);
  FlatParamGroup flat(p.named(), 0, 1, at::kFloat, false, true, false, nullptr);
  optimizer.add_group(flat.flat(), table.spans(flat, 0, flat.flat().numel()));
  for (int step = 0; step < 5; ++step) {
    const at::Tensor grads = at::randn({flat.flat().numel()});
    for (const auto& slot : flat.slots()) {
      const size_t i = slot.name == "a" ? 0 : slot.name == "b" ? 1 : 2;
      reference[i].mutable_grad() = grads.narrow(0, slot.offset, slot.numel).clone();
    }
    torch_adamw.step();
    optimizer.step({grads.clone()}, 1.0, table.resolve(adam_defaults(config)));
  }
  for (const auto& slot : flat.slots()) {
    const size_t i = slot.name == "a" ? 0 : slot.name == "b" ? 1 : 2;
    const at::Tensor got = flat.flat().narrow(0, slot.offset, slot.numel);
    EXPECT_TRUE(at::allclose(got, reference[i].detach(), 1e-6, 1e-7))
        << slot.name << ": " << got << " vs " << reference[i];
  }
}

TEST(ParamGroups, ShardOptimizerStepsEachSpanWithItsGroupAsTorchAdamW) {
  ResidentOptimizer optimizer(nullptr);
  expect_matches_torch(optimizer);
}

TEST(ParamGroups, HostOffloadedOptimizerStepsEachSpanWithItsGroupAsTorchAdamW) {
  OffloadOptimizerOptions o;
  o.device = OffloadDevice::Cpu;
  OffloadOptimizer optimizer(o, nullptr);
  expect_matches_torch(optimizer);
}
