#include "config/LaunchEnv.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "common/Error.h"

namespace zeroshard {
namespace {

class Env {
 public:
  explicit Env(const EnvLookup& lookup) : lookup_(lookup) {}

  bool has(const char* name) const {
    const char* v = lookup_(name);
    return v != nullptr && *v != '\0';
  }

  std::string text(const char* name, const std::string& fallback = "") const {
    return has(name) ? std::string(lookup_(name)) : fallback;
  }

  int number(const char* name, int min, int fallback, bool required) const {
    if (!has(name)) {
      if (required) fail("environment variable {} is not set; the launcher must set it", name);
      return fallback;
    }
    const std::string value = lookup_(name);
    char* end = nullptr;
    const long n = std::strtol(value.c_str(), &end, 10);
    if (*end != '\0' || n < min || n > 2147483647L) {
      fail("environment variable {}='{}' is not allowed; allowed: an integer >= {}", name, value,
           min);
    }
    return static_cast<int>(n);
  }

 private:
  const EnvLookup& lookup_;
};

// The four numbers every launcher sets, under its own names: rank and world size are
// required; the local ones default to `local_rank` and the whole world (one node).
struct RankNames {
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
};

void read_ranks(const Env& env, const RankNames& names, int local_rank, LaunchEnv& out) {
  out.rank = env.number(names.rank, 0, 0, true);
  out.world_size = env.number(names.world, 1, 1, true);
  out.local_rank = env.number(names.local_rank, 0, local_rank < 0 ? out.rank : local_rank, false);
  out.local_world_size = env.number(names.local_world, 1, out.world_size, false);
}

void read_torchrun(const Env& env, LaunchEnv& out) {
  out.launcher = "torchrun";
  read_ranks(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}, -1, out);
  if (!env.has("MASTER_ADDR")) fail("environment variable MASTER_ADDR is not set (RANK is)");
  out.master_addr = env.text("MASTER_ADDR");
  out.master_port = env.number("MASTER_PORT", 1, 0, true);
  out.agent_store =
      env.has("TORCHELASTIC_USE_AGENT_STORE") && env.text("TORCHELASTIC_USE_AGENT_STORE") == "True";
}

void read_slurm(const Env& env, LaunchEnv& out) {
  out.launcher = "slurm";
  read_ranks(env, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}, 0,
             out);
  // `srun -N 2 -n 4` sets no SLURM_NTASKS_PER_NODE; the step's layout says how many of
  // its tasks run on this node (and wins over a job's --ntasks-per-node).
  const std::string layout =
      env.text("SLURM_STEP_TASKS_PER_NODE",
               env.has("SLURM_NTASKS_PER_NODE") ? "" : env.text("SLURM_TASKS_PER_NODE"));
  if (!layout.empty()) {
    const int here = slurm_tasks_on_node(layout, env.number("SLURM_NODEID", 0, 0, false));
    if (here > 0) out.local_world_size = here;
  }
  if (env.has("MASTER_ADDR")) {
    out.master_addr = env.text("MASTER_ADDR");
  } else {
    const std::string list = env.text("SLURM_JOB_NODELIST", env.text("SLURM_NODELIST"));
    if (list.empty()) fail("neither MASTER_ADDR nor SLURM_JOB_NODELIST is set under Slurm");
    out.master_addr = first_slurm_host(list);
    out.master_origin = "the first node of SLURM_JOB_NODELIST";
  }
  // Every rank of the job derives the same port from the job id unless one is given.
  const int job = env.number("SLURM_JOB_ID", 0, 0, false);
  out.master_port = env.number("MASTER_PORT", 1, 20000 + job % 10000, false);
}

void read_openmpi(const Env& env, LaunchEnv& out) {
  out.launcher = "openmpi";
  read_ranks(env,
             {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE"},
             0, out);
  if (env.has("MASTER_ADDR")) {
    out.master_addr = env.text("MASTER_ADDR");
  } else if (out.local_world_size < out.world_size) {
    // mpirun maps rank 0 to the first host it was given, where it usually runs itself:
    // its own address is in every rank's environment.
    out.master_addr = first_hnp_address(env.text("OMPI_MCA_orte_hnp_uri"));
    out.master_origin = "mpirun's host (OMPI_MCA_orte_hnp_uri)";
    if (out.master_addr.empty()) {
      fail(
          "environment variable MASTER_ADDR is not set and OMPI_MCA_orte_hnp_uri names no "
          "IPv4 address of mpirun; pass -x MASTER_ADDR=<rank 0's host> to mpirun");
    }
  }
  // Every rank of one mpirun shares its job id: the port follows it unless one is given.
  const std::string job = env.text("OMPI_MCA_ess_base_jobid");
  const int fallback =
      job.empty() ? 29500 : 20000 + static_cast<int>(std::stoull("0" + job) % 10000);
  out.master_port = env.number("MASTER_PORT", 1, fallback, false);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  const auto bracket = nodelist.find('[');
  const auto comma = nodelist.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return nodelist.substr(0, comma);
  }
  const std::string prefix = nodelist.substr(0, bracket);
  const auto end = nodelist.find_first_of("-,]", bracket + 1);
  return prefix + nodelist.substr(bracket + 1, end - bracket - 1);
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  std::istringstream entries(tasks_per_node);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    int tasks = 0, nodes = 1;
    if (std::sscanf(entry.c_str(), "%d(x%d)", &tasks, &nodes) < 1) return 0;
    if (node < nodes) return tasks;
    node -= nodes;
  }
  return 0;
}

std::string first_hnp_address(const std::string& hnp_uri) {
  const std::string tag = ";tcp://";
  const auto begin = hnp_uri.find(tag);
  if (begin == std::string::npos) return "";
  const auto start = begin + tag.size();
  return hnp_uri.substr(start, hnp_uri.find_first_of(",:;", start) - start);
}

LaunchEnv read_launch_env(const EnvLookup& lookup) {
  const Env env(lookup);
  LaunchEnv out;
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    read_torchrun(env, out);
  } else if (env.has("OMPI_COMM_WORLD_RANK")) {
    read_openmpi(env, out);
  } else if (env.has("SLURM_PROCID") && env.has("SLURM_NTASKS")) {
    read_slurm(env, out);
  }
  if (out.rank >= out.world_size) {
    fail("rank {} is not below world size {} (launcher: {}); check the launcher's environment",
         out.rank, out.world_size, out.launcher);
  }
  if (out.local_rank >= out.local_world_size) out.local_world_size = out.local_rank + 1;
  return out;
}

LaunchEnv read_launch_env() {
  return read_launch_env([](const char* name) { return std::getenv(name); });
}

int threads_per_rank(const LaunchEnv& env, const EnvLookup& lookup) {
  const Env vars(lookup);
  if (vars.has("ZS_NUM_THREADS")) return vars.number("ZS_NUM_THREADS", 1, 1, true);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, env.local_world_size));
}

}  // namespace zeroshard
