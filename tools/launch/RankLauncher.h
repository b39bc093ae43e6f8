#pragma once
// Starts N real processes as ranks 0..N-1 of one job on this machine (torchrun's
// environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), waits for all of them with a time limit, and keeps each one's output.
#include <chrono>
#include <string>
#include <vector>

namespace zeroshard::launch {

struct RankResult {
  int exit_code = -1;  // -1: killed by a signal or by the time limit
  int signal = 0;
  std::string output;  // stdout and stderr together
};

struct LaunchResult {
  std::vector<RankResult> ranks;
  bool timed_out = false;
  double seconds = 0;
  bool all_ok() const;
  std::string describe() const;  // every rank's exit and last lines, for test failures
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

LaunchResult launch_ranks(int world, const std::string& program,
                          const std::vector<std::string>& args,
                          std::chrono::seconds limit = std::chrono::seconds(120));

}  // namespace zeroshard::launch
