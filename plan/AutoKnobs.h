#pragma once
// The config's `auto` keys that do not depend on the stage/offload choice: the batch keys
// (DeepSpeed's rule), the training keys, and the ZeRO buckets, prefetch, thresholds and
// buffers (Hugging Face's rules from the hidden size, DeepSpeed's defaults otherwise).
#include <string>
#include <vector>

#include "config/Config.h"
#include "plan/MemoryModel.h"
#include "plan/ModelSpec.h"

namespace zeroshard {

// Fills the three batch keys the config leaves out (or auto) from the others over the
// data-parallel ranks, as DeepSpeed does; refuses ones that do not fit together.
void resolve_batch(Config& c, const WorldShape& world, std::vector<std::string>& reasons);

// Fills the auto knobs that do not depend on the stage/offload choice.
Config resolve_auto_knobs(const Config& config, const ModelSpec& spec, const WorldShape& world,
                          std::vector<std::string>& reasons);

}  // namespace zeroshard
