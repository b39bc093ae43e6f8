#include "engine/ParamGroups.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

// torch.optim.AdamW's own checks, with the group and key named.
void check_options(size_t group, const ParamGroupOptions& o) {
  auto check = [group](const char* key, const std::optional<double>& value, bool ok,
                       const char* allowed) {
    if (value && !ok)
      fail("param_groups[{}].{}: {} is not allowed; allowed: {}", group, key, *value, allowed);
  };
  check("lr", o.lr, o.lr && *o.lr >= 0, ">= 0");
  check("eps", o.eps, o.eps && *o.eps >= 0, ">= 0");
  check("weight_decay", o.weight_decay, o.weight_decay && *o.weight_decay >= 0, ">= 0");
  check("betas[0]", o.beta1, o.beta1 && *o.beta1 >= 0 && *o.beta1 < 1, "0 <= beta1 < 1");
  check("betas[1]", o.beta2, o.beta2 && *o.beta2 >= 0 && *o.beta2 < 1, "0 <= beta2 < 1");
}

std::string shape_of(const at::Tensor& t) {
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

}  // namespace

ParamGroupTable::ParamGroupTable(std::vector<ParamGroup> groups,
                                 const std::vector<NamedParam>& params) {
  if (groups.empty()) {
    options_.emplace_back();
    return;
  }
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& p : params) name_of.emplace(p.param.unsafeGetTensorImpl(), p.name);
  for (size_t g = 0; g < groups.size(); ++g) {
    check_options(g, groups[g].options);
    for (const auto& t : groups[g].params) {
      const auto name = name_of.find(t.unsafeGetTensorImpl());
      if (name == name_of.end()) {
        fail(
            "param_groups[{}] holds a tensor of shape {} that is not a parameter of the model; "
            "allowed: the model's own parameters",
            g, shape_of(t));
      }
      const auto [it, fresh] = group_of_.emplace(t.unsafeGetTensorImpl(), g);
      if (!fresh && it->second != g) {
        fail(
            "parameter '{}' is in param_groups[{}] and param_groups[{}]; a parameter belongs "
            "to one group",
            name->second, it->second, g);
      }
    }
    options_.push_back(groups[g].options);
  }
  std::vector<std::string> missing;
  for (const auto& p : params) {
    if (p.param.requires_grad() && group_of_.count(p.param.unsafeGetTensorImpl()) == 0)
      missing.push_back(p.name);
  }
  if (!missing.empty()) {
    const size_t shown = std::min<size_t>(missing.size(), 5);
    fail(
        "{} trainable parameter(s) are in no parameter group: {}{}; add them to a group, or "
        "set requires_grad=False on those to freeze them",
        missing.size(), fmt::join(missing.begin(), missing.begin() + shown, ", "),
        missing.size() > shown ? ", ..." : "");
  }
}

void ParamGroupTable::set_options(size_t group, const ParamGroupOptions& options) {
  if (group >= options_.size())
    fail("param_groups[{}]: there are {} parameter groups", group, options_.size());
  check_options(group, options);
  options_[group] = options;
}

std::vector<AdamHyper> ParamGroupTable::resolve(
    const AdamHyper& d, const std::vector<ScheduledGroup>* scheduled) const {
  std::vector<AdamHyper> out;
  for (size_t g = 0; g < options_.size(); ++g) {
    const ParamGroupOptions& o = options_[g];
    const ScheduledGroup* s = scheduled ? &scheduled->at(g) : nullptr;
    AdamHyper h;
    h.lr = s ? s->lr : o.lr.value_or(d.lr);
    h.beta1 = s && s->beta1 ? *s->beta1 : o.beta1.value_or(d.beta1);
    h.beta2 = s && s->beta2 ? *s->beta2 : o.beta2.value_or(d.beta2);
    h.eps = o.eps.value_or(d.eps);
    h.weight_decay = o.weight_decay.value_or(d.weight_decay);
    h.decoupled = o.decoupled.value_or(d.decoupled);
    h.bias_correction = o.bias_correction.value_or(d.bias_correction);
    out.push_back(h);
  }
  return out;
}

std::vector<double> ParamGroupTable::lrs(const AdamHyper& defaults) const {
  std::vector<double> out;
  for (const auto& o : options_) out.push_back(o.lr.value_or(defaults.lr));
  return out;
}

size_t ParamGroupTable::group_of(const ParamSlot& slot) const {
  const auto it = group_of_.find(slot.param.unsafeGetTensorImpl());
  return it == group_of_.end() ? 0 : it->second;
}

std::vector<HyperSpan> ParamGroupTable::spans(const FlatParamGroup& group, int64_t begin,
                                              int64_t count) const {
  if (options_.size() <= 1 || group.slots().empty()) return {};
  // Slots are in offset order. An element belongs to the last slot starting at or
  // before it: padding between and after parameters goes with the parameter before it.
  const auto& slots = group.slots();
  size_t first = 0;
  while (first + 1 < slots.size() && slots[first + 1].offset <= begin) ++first;
  std::vector<HyperSpan> out{{0, 0, group_of(slots[first])}};
  for (size_t i = first + 1; i < slots.size() && slots[i].offset < begin + count; ++i) {
    const size_t g = group_of(slots[i]);
    if (g != out.back().group) out.push_back({slots[i].offset - begin, 0, g});
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].count = (i + 1 < out.size() ? out[i + 1].begin : count) - out[i].begin;
  }
  return out;
}

}  // namespace zeroshard
