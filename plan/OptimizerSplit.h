#pragma once
// offload_optimizer.ratio below 1 (DeepSpeed's ZeRO-Offload++ "Twin-Flow"): which of
// this rank's optimizer shards step on the host and which keep their state on the GPU.
// As DeepSpeed splits its sub-groups, the last ones go to the host: a shard goes there
// once the elements before it reach (1 - ratio) of the whole, so the device keeps the
// first (1 - ratio) of the elements, rounded up to a whole shard. The memory model and
// the Engine both decide with this function, so the plan and the ledger agree.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zeroshard {

// `numels`: each trainable shard's elements, in group order; true where it steps on the host.
std::vector<bool> optimizer_on_host(const std::vector<int64_t>& numels, double ratio);

// The ratio that puts on the host exactly the shards from `first` on: the inverse of the
// above, for the Planner's auto.
double ratio_from(const std::vector<int64_t>& numels, size_t first);

}  // namespace zeroshard
