#pragma once
// Optimizer parameter groups: torch's param_groups, DeepSpeed's model_parameters given
// as dicts. Each group names its parameters and may set its own Adam hyperparameters;
// what a group leaves unset comes from the config's optimizer section. A config
// scheduler sets every group's lr, as DeepSpeed's schedulers do.
//
// Groups cut across the flat buffers (a stage-3 unit holds weights that decay and
// biases that do not), so the table also says, for any range of a buffer, which group
// each element belongs to (HyperSpan); the optimizers step span by span.
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/AdamHyper.h"
#include "config/Config.h"
#include "config/LrSchedule.h"
#include "sharding/FlatParamGroup.h"
#include "zeroshard/Types.h"  // ParamGroup, ParamGroupOptions

namespace zeroshard {

class ParamGroupTable {
 public:
  ParamGroupTable() = default;
  // `params`: the model's parameters, each once (for names in errors). With no groups,
  // every parameter is in one group with the config's values. Otherwise each trainable
  // parameter must be in exactly one group, and every grouped tensor a parameter.
  ParamGroupTable(std::vector<ParamGroup> groups, const std::vector<NamedParam>& params);

  size_t size() const { return options_.size(); }
  const ParamGroupOptions& options(size_t group) const { return options_.at(group); }
  void set_options(size_t group, const ParamGroupOptions& options);

  // The hyperparameters of every group for the next step: its own where set, else
  // `defaults` (the config optimizer's). `scheduled`: the config scheduler's values, one
  // per group (config/LrSchedule.h), which replace the group's lr (and betas, where set).
  std::vector<AdamHyper> resolve(const AdamHyper& defaults,
                                 const std::vector<ScheduledGroup>* scheduled = nullptr) const;
  // Each group's own lr, the config optimizer's where it sets none.
  std::vector<double> lrs(const AdamHyper& defaults) const;

  // Which group each element of flat buffer elements [begin, begin + count) belongs to,
  // in coordinates relative to `begin`. Padding between and after parameters goes with
  // the parameter before it (its gradient is zero, its value stays zero).
  std::vector<HyperSpan> spans(const FlatParamGroup& group, int64_t begin, int64_t count) const;

 private:
  size_t group_of(const ParamSlot& slot) const;
  std::vector<ParamGroupOptions> options_;
  std::unordered_map<const void*, size_t> group_of_;  // TensorImpl -> group
};

}  // namespace zeroshard
