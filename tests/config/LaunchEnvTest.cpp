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

TEST(LaunchEnv, SlurmCountsThisNodesTasksFromTheStepLayout) {
  // What `srun -N 2 -n 4` set on the second node (tests/python/test_launchers.py runs it).
  const LaunchEnv e = from({{"SLURM_PROCID", "3"},
                            {"SLURM_NTASKS", "4"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_NODEID", "1"},
                            {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                            {"SLURM_TASKS_PER_NODE", "2(x2)"},
                            {"SLURM_JOB_NODELIST", "zs1h[0-1]"},
                            {"SLURM_JOB_ID", "7"}});
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "zs1h0");
  EXPECT_EQ(e.master_origin, "the first node of SLURM_JOB_NODELIST");
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 0), 3);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 1), 3);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 2), 1);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 3), 0);
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
}

TEST(LaunchEnv, OpenMpiFindsMpirunsHostAcrossNodes) {
  // What mpirun -np 4 --host h0:2,h1:2 set on h1 (tests/python/test_launchers.py runs it).
  const LaunchEnv e = from({{"OMPI_COMM_WORLD_RANK", "2"},
                            {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                            {"OMPI_MCA_ess_base_jobid", "2365784065"},
                            {"OMPI_MCA_orte_hnp_uri", "2365784064.0;tcp://10.213.0.1:36229"}});
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.213.0.1");
  EXPECT_EQ(e.master_port, 20000 + static_cast<int>(2365784065ULL % 10000));
  EXPECT_EQ(first_hnp_address("1.0;tcp://10.0.0.1,172.17.0.1:41733;tcp6://[fd00::2]:5"),
            "10.0.0.1");
  EXPECT_EQ(first_hnp_address("1.0;tcp6://[fd00::2]:5"), "");
}

TEST(LaunchEnv, OpenMpiOnOneHostUsesLoopbackAndMasterAddrWins) {
  const LaunchEnv one = from({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(one.master_addr, "127.0.0.1");
  EXPECT_EQ(one.master_port, 29500);
  const LaunchEnv e = from({{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                            {"OMPI_MCA_orte_hnp_uri", "1.0;tcp://10.213.0.1:36229"},
                            {"MASTER_ADDR", "h0"}});
  EXPECT_EQ(e.master_addr, "h0");
  const std::string msg = error_of({{"OMPI_COMM_WORLD_RANK", "0"},
                                    {"OMPI_COMM_WORLD_SIZE", "2"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_NE(msg.find("MASTER_ADDR is not set"), std::string::npos) << msg;
  EXPECT_NE(msg.find("-x MASTER_ADDR"), std::string::npos) << msg;
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
