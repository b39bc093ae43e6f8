#include "config/LaunchEnv.h"

#include <map>

#include <gtest/gtest.h>

#include "common/Error.h"

using namespace zeroshard;

namespace {

LaunchEnv from(const std::map<std::string, std::string>& vars) {
  return read_launch_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    from(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchEnv e = from({});
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = from({{"RANK", "3"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "2"},
                            {"MASTER_ADDR", "10.0.0.1"},
                            {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_FALSE(e.agent_store);  // plain RANK/WORLD_SIZE: rank 0 serves the store
}

TEST(LaunchEnv, TorchrunsAgentServesTheStore) {
  const LaunchEnv e = from({{"RANK", "0"},
                            {"WORLD_SIZE", "2"},
                            {"MASTER_ADDR", "127.0.0.1"},
                            {"MASTER_PORT", "29500"},
                            {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_TRUE(e.agent_store);
}

TEST(LaunchEnv, SlurmTakesTheFirstNodeAndAJobPort) {
  const LaunchEnv e = from({{"SLURM_PROCID", "5"},
                            {"SLURM_NTASKS", "16"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_NTASKS_PER_NODE", "8"},
                            {"SLURM_JOB_NODELIST", "gpu[07-08,11],login"},
                            {"SLURM_JOB_ID", "4321"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 24321);
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_EQ(first_slurm_host("n[3]"), "n3");
}

TEST(LaunchEnv, OpenMpiNeedsMasterAddr) {
  const std::string msg = error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_NE(msg.find("MASTER_ADDR is not set"), std::string::npos) << msg;
  const LaunchEnv e = from({{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"MASTER_ADDR", "h0"}});
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, ContradictionsNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
          .find("rank 2 is not below world size 2"),
      std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
}

TEST(LaunchEnv, ThreadsPerRank) {
  LaunchEnv e;
  e.local_world_size = 1;
  auto none = [](const char*) -> const char* { return nullptr; };
  EXPECT_GE(threads_per_rank(e, none), 1);
  auto forced = [](const char* n) -> const char* {
    return std::string(n) == "ZS_NUM_THREADS" ? "3" : nullptr;
  };
  EXPECT_EQ(threads_per_rank(e, forced), 3);
}
