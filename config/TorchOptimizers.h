#pragma once
// Optimizer types that torch.optim's own classes step (optim/ExternalOptimizer.h).
// DeepSpeed takes any torch.optim class name as `optimizer.type` and passes `params` to
// it; zeroshard does the same for the classes whose update is elementwise, where a
// shard steps exactly as the whole tensor would. Adam and AdamW are zeroshard's own
// (CpuAdam, the fused device step). DeepSpeed's other types are refused with the reason.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zeroshard {

// A torch.optim class's keyword arguments as the config writes them: name -> the value
// as YAML text ("0.9", "true", "[0.9, 0.999]").
using TorchOptimizerParams = std::map<std::string, std::string>;

// The torch.optim classes a config may name, in the order messages list them.
const std::vector<std::string>& torch_optimizer_types();
bool is_torch_optimizer_type(const std::string& type);

// Why zeroshard does not offer the DeepSpeed optimizer type `type`, and what to use
// instead; nullptr where it is not one of those.
const char* refused_optimizer_reason(const std::string& type);

// Bytes per trained element of the state `type` keeps besides the fp32 master, with
// torch's defaults for the params not given: SGD 4 with momentum (0 without),
// Adagrad 4, RMSprop 4 (+4 momentum, +4 centered), Adam/AdamW and the rest 8.
int64_t optimizer_state_bytes(const std::string& type, const TorchOptimizerParams& params);

}  // namespace zeroshard
