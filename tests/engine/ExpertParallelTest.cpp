// engine/ExpertParallel: what expert parallelism is not composed with is refused before any
// group is built, each message naming the setting and what is allowed; the settings it is
// composed with pass; checkpoints are refused with ep_size > 1 and not without.
#include "engine/ExpertParallel.h"

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/Error.h"

using namespace zeroshard;

namespace {

std::vector<NamedParam> params_with_experts(bool experts) {
  NamedParam dense{"dense.weight", torch::zeros({4, 4})};
  NamedParam expert{"experts.gate_up_proj", torch::zeros({2, 8, 4})};
  expert.expert = experts;
  return {dense, expert};
}

TrainingSettings at_ep(int64_t ep, const std::function<void(TrainingSettings&)>& change = {}) {
  TrainingSettings s;
  s.stage = ZeroStage(2);
  s.expert_parallel_size = ep;
  if (change) change(s);
  return s;
}

std::string refusal(const TrainingSettings& s, bool experts = true) {
  try {
    check_expert_parallel(s, params_with_experts(experts));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ExpertParallel, WhatItIsNotComposedWithIsRefusedByName) {
  const std::string head = "expert parallelism (the MoE layers' ep_size 2) with ";
  const std::vector<std::pair<std::function<void(TrainingSettings&)>, std::string>> cases = {
      {[](TrainingSettings& s) { s.tensor_parallel_size = 2; },
       "tensor parallelism: not composed in zeroshard yet; allowed: tensor_parallel.autotp_size 1"},
      {[](TrainingSettings& s) { s.pipeline_parallel_size = 2; }, "pipeline stages"},
      {[](TrainingSettings& s) { s.sequence_parallel_size = 2; }, "sequence parallelism"},
      {[](TrainingSettings& s) { s.mics_shard_size = 2; }, "zero_optimization.mics_shard_size"},
      {[](TrainingSettings& s) { s.optimizer.type = "Lamb"; }, "optimizer 'Lamb'"},
      {[](TrainingSettings& s) { s.offload_param.device = OffloadDevice::Cpu; },
       "zero_optimization.offload_param"},
      {[](TrainingSettings& s) {
         s.stage = ZeroStage(3);
         s.hpz_partition_size = 2;
       },
       "zero_optimization.zero_hpz_partition_size"},
      {[](TrainingSettings& s) {
         s.stage = ZeroStage(0);
         s.offload_optimizer.device = OffloadDevice::Cpu;
       },
       "zero_optimization.offload_optimizer at stage 0"},
  };
  for (const auto& [change, said] : cases) {
    const std::string error = refusal(at_ep(2, change));
    EXPECT_NE(error.find(head + said), std::string::npos) << error;
    EXPECT_NE(error.find("or ep_size 1 (every rank holding every expert)"), std::string::npos);
    EXPECT_EQ(refusal(at_ep(1, change)), "") << "ep_size 1 composes with everything";
  }
  EXPECT_NE(refusal(at_ep(2), /*experts=*/false)
                .find("the MoE layers' ep_size is 2, but no parameter is an expert's"),
            std::string::npos);
  // What it is composed with: every stage, the optimizer offloaded at stages 1-3.
  for (int stage : {0, 1, 2, 3})
    EXPECT_EQ(refusal(at_ep(2, [stage](TrainingSettings& s) { s.stage = ZeroStage(stage); })), "");
  EXPECT_EQ(refusal(at_ep(
                2, [](TrainingSettings& s) { s.offload_optimizer.device = OffloadDevice::Cpu; })),
            "");
}
