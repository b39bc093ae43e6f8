#include "config/TorchOptimizers.h"

#include <algorithm>
#include <cctype>

namespace zeroshard {
namespace {

// A param's number (0 where missing, false or not a number); true counts as 1.
double number_of(const TorchOptimizerParams& params, const std::string& key) {
  const auto it = params.find(key);
  if (it == params.end()) return 0;
  if (it->second == "true" || it->second == "True") return 1;
  try {
    return std::stod(it->second);
  } catch (...) {
    return 0;
  }
}

}  // namespace

const std::vector<std::string>& torch_optimizer_types() {
  static const auto* types = new std::vector<std::string>{
      "SGD", "Adagrad", "RMSprop", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop"};
  return *types;
}

bool is_torch_optimizer_type(const std::string& type) {
  const auto& t = torch_optimizer_types();
  return std::find(t.begin(), t.end(), type) != t.end();
}

const char* refused_optimizer_reason(const std::string& type) {
  static const auto* reasons = new std::map<std::string, const char*>{
      {"OneBitAdam",
       "1-bit Adam compresses gradients with error feedback; zeroshard reduces them in full "
       "precision: use Adam"},
      {"ZeroOneAdam",
       "0/1 Adam compresses gradients with error feedback; zeroshard reduces them in full "
       "precision: use Adam"},
      {"OneBitLamb", "1-bit LAMB compresses gradients and needs whole-parameter norms; use AdamW"},
      {"Lion",
       "torch.optim has no Lion; pass a Lion optimizer object to initialize(optimizer=...): "
       "its elementwise update is stepped on the shards"},
      {"MuAdam",
       "mup's optimizers come from the mup package; pass one to initialize(optimizer=...)"},
      {"MuAdamW",
       "mup's optimizers come from the mup package; pass one to initialize(optimizer=...)"},
      {"MuSGD",
       "mup's optimizers come from the mup package; pass one to initialize(optimizer=...)"},
      {"LBFGS", "L-BFGS steps with a closure over whole parameters; use a first-order optimizer"},
      {"SparseAdam", "SparseAdam steps sparse gradients; zeroshard's gradients are dense"},
  };
  // DeepSpeed reads its own optimizer names in any case ("OnebitAdam" is 1-bit Adam).
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  };
  for (const auto& [name, reason] : *reasons)
    if (lower(name) == lower(type)) return reason;
  return nullptr;
}

int64_t optimizer_state_bytes(const std::string& type, const TorchOptimizerParams& params) {
  if (type == "SGD") return number_of(params, "momentum") != 0 ? 4 : 0;
  if (type == "Adagrad" || type == "ASGD") return 4;
  if (type == "RMSprop") {
    return 4 + (number_of(params, "momentum") != 0 ? 4 : 0) +
           (number_of(params, "centered") != 0 ? 4 : 0);
  }
  return 8;  // Adam, AdamW, Adadelta, Adamax, NAdam, RAdam, Rprop: two arrays
}

}  // namespace zeroshard
