#include "plan/OptimizerSplit.h"

#include <numeric>

namespace zeroshard {

std::vector<bool> optimizer_on_host(const std::vector<int64_t>& numels, double ratio) {
  const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
  // Half an element of slack: a ratio written out and read back (ratio_from's, through a
  // YAML file) lands on the same shard whatever its last bit.
  const double kept = (1.0 - ratio) * static_cast<double>(total) - 0.5;
  std::vector<bool> on_host(numels.size());
  int64_t before = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    on_host[i] = ratio >= 1 || static_cast<double>(before) >= kept;
    before += numels[i];
  }
  return on_host;
}

double ratio_from(const std::vector<int64_t>& numels, size_t first) {
  const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
  if (total == 0 || first == 0) return 1.0;
  int64_t before = 0;
  for (size_t i = 0; i < first && i < numels.size(); ++i) before += numels[i];
  return 1.0 - static_cast<double>(before) / static_cast<double>(total);
}

}  // namespace zeroshard
