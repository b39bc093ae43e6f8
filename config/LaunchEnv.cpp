#include "config/LaunchEnv.h"

#include <cstdlib>
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
  if (env.has("MASTER_ADDR")) {
    out.master_addr = env.text("MASTER_ADDR");
  } else {
    const std::string list = env.text("SLURM_JOB_NODELIST", env.text("SLURM_NODELIST"));
    if (list.empty()) fail("neither MASTER_ADDR nor SLURM_JOB_NODELIST is set under Slurm");
    out.master_addr = first_slurm_host(list);
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
  if (out.world_size > 1 && !env.has("MASTER_ADDR")) {
    fail(
        "environment variable MASTER_ADDR is not set; under mpirun pass "
        "-x MASTER_ADDR=<first host> (and optionally -x MASTER_PORT)");
  }
  out.master_addr = env.text("MASTER_ADDR", "127.0.0.1");
  out.master_port = env.number("MASTER_PORT", 1, 29500, false);
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
