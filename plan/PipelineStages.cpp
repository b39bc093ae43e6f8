#include "plan/PipelineStages.h"

#include <algorithm>
#include <numeric>

#include "common/Error.h"

namespace zeroshard {

std::pair<int64_t, int64_t> stage_blocks(int64_t layers, int64_t stages, int64_t stage) {
  if (stages <= 1) return {0, layers};
  const int64_t share = layers / stages, extra = layers % stages;
  const int64_t first = stage * share + std::min(stage, extra);
  return {first, share + (stage < extra ? 1 : 0)};
}

int64_t micro_batches_in_flight(const std::string& schedule, int64_t stages, int64_t stage,
                                int64_t micro_batches, const std::string& what) {
  if (schedule == "gpipe") return micro_batches;
  if (schedule == "1f1b") return std::min(micro_batches, stages - stage);
  if (runs_several_stages(schedule))
    fail("{}: '{}' runs several stages on each rank; planned with parts_in_flight", what, schedule);
  fail("{}: '{}' is not allowed; allowed: 1f1b, gpipe, interleaved1f1b or loopedbfs", what,
       schedule);
}

bool runs_several_stages(const std::string& schedule) {
  return schedule == "interleaved1f1b" || schedule == "loopedbfs";
}

std::vector<int64_t> stages_of_rank(int64_t ranks, int64_t per_rank, int64_t rank) {
  std::vector<int64_t> stages;
  for (int64_t v = 0; v < per_rank; ++v) stages.push_back(rank + v * ranks);
  return stages;
}

namespace {

// Records the held and forwarded counts after each forward (+1) or backward (-1).
class Order {
 public:
  explicit Order(int64_t parts) : now_{std::vector<int64_t>(parts), std::vector<int64_t>(parts)} {}
  void forward(int64_t part) {
    ++now_.held[part];
    ++now_.forwarded[part];
    steps_.push_back(now_);
  }
  void backward(int64_t part) {
    --now_.held[part];
    steps_.push_back(now_);
  }
  std::vector<PartsStep> steps() && { return std::move(steps_); }

 private:
  PartsStep now_;
  std::vector<PartsStep> steps_;
};

// torch's ScheduleInterleaved1F1B._calculate_single_rank_operations, its order alone.
std::vector<PartsStep> interleaved_1f1b(int64_t ranks, int64_t per_rank, int64_t rank,
                                        int64_t micro_batches, const std::string& what) {
  const int64_t rounds = std::max<int64_t>(1, micro_batches / ranks);
  if (micro_batches % rounds != 0) {
    fail(
        "{}: interleaved1f1b with {} micro-batches over {} ranks; allowed: a multiple of its "
        "rounds ({}), as torch's ScheduleInterleaved1F1B requires",
        what, micro_batches, ranks, rounds);
  }
  const int64_t per_round = micro_batches / rounds;
  const int64_t ops = per_rank * micro_batches;
  const int64_t warmup = std::min((per_rank - 1) * per_round + 2 * (ranks - 1 - rank), ops);
  const auto forward_part = [&](int64_t op) { return (op / per_round) % per_rank; };
  const auto backward_part = [&](int64_t op) {
    return per_rank - 1 - ((op - warmup) / per_round) % per_rank;
  };
  Order order(per_rank);
  for (int64_t op = 0; op < ops + warmup; ++op) {
    if (op < ops) order.forward(forward_part(op));
    if (op >= warmup) order.backward(backward_part(op));
  }
  return std::move(order).steps();
}

}  // namespace

std::vector<PartsStep> parts_in_flight(const std::string& schedule, int64_t ranks, int64_t per_rank,
                                       int64_t rank, int64_t micro_batches,
                                       const std::string& what) {
  if (schedule == "interleaved1f1b")
    return interleaved_1f1b(ranks, per_rank, rank, micro_batches, what);
  if (schedule != "loopedbfs") {
    fail(
        "{}: '{}' does not run several stages on each rank; allowed: interleaved1f1b or "
        "loopedbfs",
        what, schedule);
  }
  Order order(per_rank);
  for (int64_t part = 0; part < per_rank; ++part)
    for (int64_t m = 0; m < micro_batches; ++m) order.forward(part);
  for (int64_t part = per_rank - 1; part >= 0; --part)
    for (int64_t m = 0; m < micro_batches; ++m) order.backward(part);
  return std::move(order).steps();
}

int64_t most_in_flight(const std::vector<PartsStep>& steps) {
  int64_t most = 0;
  for (const PartsStep& step : steps)
    most = std::max(most, std::accumulate(step.held.begin(), step.held.end(), int64_t{0}));
  return most;
}

}  // namespace zeroshard
