#pragma once
// Who this process is among the ranks, read from the launcher's environment:
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST) or Open MPI
// (OMPI_COMM_WORLD_*). No launcher at all means one process, rank 0 of 1.
#include <functional>
#include <string>

namespace zeroshard {

struct LaunchEnv {
  std::string launcher = "none";  // torchrun | slurm | openmpi | none
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Where master_addr came from, for errors: rank 0 must run on that host.
  std::string master_origin = "MASTER_ADDR";
  // The rendezvous store at MASTER_ADDR:MASTER_PORT is already served, by torchrun's
  // agent (TORCHELASTIC_USE_AGENT_STORE=True) or by torch.distributed initialised in
  // this process (the Python package says so): every rank connects to it as a client.
  bool agent_store = false;
};

using EnvLookup = std::function<const char*(const char*)>;

// Throws Error naming the variable when the environment is missing a value or
// contradicts itself (RANK >= WORLD_SIZE, a non-number, ...).
LaunchEnv read_launch_env(const EnvLookup& lookup);
LaunchEnv read_launch_env();  // from the process environment

// "node[01-04,07],gpu5" -> "node01": the first host of a Slurm node list.
std::string first_slurm_host(const std::string& nodelist);

// Tasks on node `node` of a Slurm step from SLURM_STEP_TASKS_PER_NODE's form:
// "2(x3),1" -> nodes 0-2 run 2 tasks, node 3 runs 1. Zero when the list is shorter.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

// "2365784064.0;tcp://10.0.0.1,10.0.0.2:41733;tcp6://..." -> "10.0.0.1": the first IPv4
// address of mpirun's own process (Open MPI's OMPI_MCA_orte_hnp_uri); "" when none.
std::string first_hnp_address(const std::string& hnp_uri);

// Intra-op threads for one rank: ZS_NUM_THREADS when set, else the machine's cores
// divided among the ranks on this node (torchrun's OMP_NUM_THREADS=1 is ignored).
int threads_per_rank(const LaunchEnv& env, const EnvLookup& lookup);

}  // namespace zeroshard
