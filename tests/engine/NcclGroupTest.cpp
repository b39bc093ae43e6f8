// The NCCL group: built whenever the build's torch has CUDA, and working on a GPU.
// The GPU cases skip with one line where no device is visible (as on CI).
#include "engine/NcclGroup.h"

#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "common/Error.h"
#include "common/MemoryLedger.h"
#include "engine/ProcessGroupSetup.h"
#include "sharding/Collectives.h"
#include "tests/common/BuildPython.h"

namespace zeroshard {
namespace {

TEST(NcclGroup, BuiltExactlyWhenTorchHasCuda) {
  const std::string cuda = testing::build_python_prints("import torch; print(torch.version.cuda)");
  ASSERT_FALSE(cuda.empty());
  EXPECT_EQ(nccl_built(), cuda != "None") << "torch.version.cuda is " << cuda;
}

TEST(NcclGroup, WithoutCudaTheErrorSaysWhatToDo) {
  if (nccl_built()) GTEST_SKIP() << "this build has CUDA: the refusal is for builds without it";
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    make_nccl_group(store, 0, 1, 0, std::chrono::seconds(10), false);
    FAIL() << "a build without CUDA made an NCCL group";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("there is no NCCL here: this build's LibTorch has no CUDA"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cuda_device_count(), 0);
}

TEST(NcclGroup, OneRankCollectivesOnTheGpu) {
  if (const std::string why = why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = make_nccl_group(store, 0, 1, 0, std::chrono::seconds(60), true);
  EXPECT_EQ(group->getBackendName(), "nccl");
  const auto opts = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor x = at::arange(1024, opts.dtype(at::kFloat));
  std::vector<at::Tensor> tensors{x};
  group->allreduce(tensors)->wait();
  EXPECT_TRUE(at::equal(x.cpu(), at::arange(1024, at::kFloat)));
  at::Tensor gathered = at::empty({1024}, opts.dtype(at::kBFloat16));
  at::Tensor mine = at::arange(1024, opts.dtype(at::kBFloat16));
  group->_allgather_base(gathered, mine)->wait();
  EXPECT_TRUE(at::equal(gathered.cpu(), mine.cpu()));
}

// Collectives' reductions over NCCL (sharding/Collectives.h): the native reduce-scatter in
// the gradients' dtype, the native one in another wire dtype (communication_data_type),
// alltoall summed in fp32 for 16-bit gradients, an all-reduce in a wire dtype. With one
// rank each is a copy, rounded as its wire dtype rounds; the scratch is given back.
TEST(NcclGroup, OneRankReductionsInEveryWireDtype) {
  if (const std::string why = why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  auto store = c10::make_intrusive<c10d::HashStore>();
  MemoryLedger ledger;
  Collectives comm(make_nccl_group(store, 0, 1, 0, std::chrono::seconds(60), true), 0, 1, nullptr,
                   &ledger);
  const at::Tensor x = at::randn({4096}, at::TensorOptions().device(at::kCUDA, 0));
  const at::Tensor host = x.cpu();
  const auto rounded = [&](at::ScalarType t) { return host.to(t).to(at::kFloat); };
  at::Tensor out = at::empty_like(x);
  comm.reduce_scatter_sum(x, out).wait();
  EXPECT_TRUE(at::equal(out.cpu(), host));
  comm.reduce_scatter_sum(x, out, at::kBFloat16).wait();
  EXPECT_TRUE(at::equal(out.cpu(), rounded(at::kBFloat16)));
  comm.reduce_scatter_sum(x.to(at::kHalf), out).wait();
  EXPECT_TRUE(at::equal(out.cpu(), rounded(at::kHalf)));
  at::Tensor sum = x.clone();
  comm.all_reduce_sum(sum, at::kBFloat16).wait();
  EXPECT_TRUE(at::equal(sum.cpu(), rounded(at::kBFloat16)));
  EXPECT_EQ(ledger.current(Tier::Device, Kind::CommBuckets), 0);
}

TEST(NcclGroup, AskingForAMissingDeviceNamesIt) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no CUDA";
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int missing = cuda_device_count();  // one past the last device
  try {
    make_nccl_group(store, 0, 1, missing, std::chrono::seconds(10), false);
    FAIL() << "made a group on a device that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the model is on cuda:" + std::to_string(missing)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zeroshard

namespace zeroshard {
namespace {

std::string backend_error(const char* backend, c10::Device device) {
  ::setenv("ZS_DIST_BACKEND", backend, 1);
  LaunchEnv env;
  env.world_size = 1;
  std::string what;
  try {
    init_distributed(env, std::chrono::seconds(10), device);
  } catch (const Error& e) {
    what = e.what();
  }
  ::unsetenv("ZS_DIST_BACKEND");
  return what;
}

// ZS_DIST_BACKEND picks Gloo or NCCL for CUDA tensors; anything else, or NCCL for a
// model on the CPU, is refused by name.
TEST(NcclGroup, TheBackendVariableIsCheckedByName) {
  EXPECT_NE(backend_error("mpi", c10::Device(c10::kCPU))
                .find("ZS_DIST_BACKEND is 'mpi'; allowed: nccl or gloo (or unset)"),
            std::string::npos);
  EXPECT_NE(backend_error("nccl", c10::Device(c10::kCPU))
                .find("ZS_DIST_BACKEND is 'nccl' but the model is on cpu; allowed: gloo"),
            std::string::npos);
  EXPECT_EQ(backend_error("gloo", c10::Device(c10::kCPU)), "");  // one rank: no group
}

}  // namespace
}  // namespace zeroshard
