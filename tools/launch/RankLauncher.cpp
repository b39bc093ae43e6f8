#include "tools/launch/RankLauncher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "common/Files.h"

namespace zeroshard::launch {
namespace fs = std::filesystem;

namespace {

// The kernel's ephemeral range (ip_local_port_range), from which every outgoing
// connection gets its local port: Gloo's pairs, the store's clients, other jobs'.
std::pair<int, int> ephemeral_ports() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 32768, hi = 60999;
  in >> lo >> hi;
  return {lo, hi};
}

bool bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

}  // namespace

// A port free now and outside the ephemeral range: one that bind(0) hands out can be
// given to another process's outgoing connection before rank 0 listens on it (seen as
// a rank that never reaches the store while tests run side by side).
int free_port() {
  const auto [lo, hi] = ephemeral_ports();
  const bool below = lo > 11000;
  const int first = below ? 10000 : hi + 1, last = below ? lo - 1 : 65535;
  std::mt19937 pick(std::random_device{}());
  std::uniform_int_distribution<int> port(first, last);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int p = port(pick);
    if (bindable(p)) return p;
  }
  throw std::runtime_error(fmt::format("no free port in {}-{}", first, last));
}

bool LaunchResult::all_ok() const {
  if (timed_out) return false;
  for (const auto& r : ranks)
    if (r.exit_code != 0) return false;
  return true;
}

std::string LaunchResult::describe() const {
  std::string out = timed_out ? "TIMED OUT\n" : "";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const auto& r = ranks[i];
    const std::string& o = r.output;
    out += fmt::format("--- rank {}: exit {} signal {}\n{}\n", i, r.exit_code, r.signal,
                       o.size() > 3000 ? o.substr(o.size() - 3000) : o);
  }
  return out;
}

LaunchResult launch_ranks(int world, const std::string& program,
                          const std::vector<std::string>& args, std::chrono::seconds limit) {
  const int port = free_port();
  const fs::path logs = fs::temp_directory_path() / fmt::format("zs_ranks_{}_{}", getpid(), port);
  fs::create_directories(logs);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const std::string log = (logs / fmt::format("rank{}.log", rank)).string();
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (!std::getenv("ZS_NUM_THREADS")) setenv("ZS_NUM_THREADS", "1", 1);
      setenv("OMP_NUM_THREADS", std::getenv("ZS_NUM_THREADS"), 1);  // as torchrun does
      std::vector<char*> argv{const_cast<char*>(program.c_str())};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(program.c_str(), argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  LaunchResult result;
  result.ranks.resize(world);
  const auto start = std::chrono::steady_clock::now();
  size_t remaining = pids.size();
  while (remaining > 0) {
    for (int rank = 0; rank < world; ++rank) {
      if (pids[rank] == 0) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        result.ranks[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        result.ranks[rank].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        pids[rank] = 0;
        --remaining;
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() - start > limit) {
      result.timed_out = true;
      for (pid_t pid : pids)
        if (pid != 0) kill(pid, SIGKILL);
      for (pid_t pid : pids)
        if (pid != 0) waitpid(pid, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int rank = 0; rank < world; ++rank) {
    result.ranks[rank].output =
        read_whole_file((logs / fmt::format("rank{}.log", rank)).string(), "launcher");
  }
  fs::remove_all(logs);
  return result;
}

}  // namespace zeroshard::launch
