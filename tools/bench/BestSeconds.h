#pragma once
// The shortest of `repeats` wall-clock timings of f(): benchmarks compare best times,
// which drift least on a shared machine.
#include <algorithm>
#include <chrono>

namespace zeroshard::bench {

template <typename F>
double best_seconds(F&& f, int repeats = 5) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace zeroshard::bench
