#pragma once
// What serving a model moves for each generated token and the throughput that bounds
// (docs/memory-model.md "Inference"): every forward reads every weight once, from the
// tier the plan keeps it in, so a decoding step (one new token for each sequence of the
// batch) takes at least the weights' bytes over that tier's bandwidth.
#include <cstdint>
#include <string>

#include "config/Config.h"
#include "plan/MemoryModel.h"
#include "plan/ModelSpec.h"

namespace zeroshard {

// Bytes per second. Defaults: an H100 SXM's HBM3, a PCIe 4.0 x16 link's measured rate,
// one PCIe 4.0 NVMe drive's sequential reads.
struct Bandwidths {
  double device = 3.35e12;
  double host_link = 25e9;  // host RAM to one device, per rank
  double nvme = 6e9;        // per node, shared by its ranks
};

struct ServingStream {
  Tier weights = Tier::Device;  // where each rank's weights rest
  // Read by each rank for one forward: from the device's memory the whole model (its
  // tensor-parallel slices), from host RAM and NVMe its shard.
  int64_t device_bytes = 0, host_bytes = 0, nvme_bytes = 0;
  double nvme_rate = 0;          // one rank's share of its node's NVMe, at most its host link
  double seconds_per_step = 0;   // the sum of each tier's bytes over its rate
  double tokens_per_second = 0;  // per rank: its batch over seconds_per_step
  std::string bound_by;          // the tier whose reads take longest
};

// Whether a served model (every unit frozen) is planned with `option`: it has no optimizer,
// so stages 1 and 2 shard only what it lacks, and a row that differs from another only in
// where the optimizer would be (unless `fixed` names that place) is the same bytes.
bool serving_option(const PlanOption& option, const Config& fixed);

ServingStream serving_stream(const ModelSpec& spec, const PlanOption& option, const Config& config,
                             const WorldShape& world, const TrainingShape& shape,
                             const Bandwidths& bandwidths);

}  // namespace zeroshard
