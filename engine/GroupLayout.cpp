#include "engine/GroupLayout.h"

#include <unordered_map>

namespace zeroshard {
namespace {

const void* key(const at::Tensor& t) {
  return t.unsafeGetTensorImpl();
}

void add_buckets(const std::vector<NamedParam>& list, bool trainable, int64_t bucket,
                 std::vector<GroupSpec>& out) {
  GroupSpec current;
  current.trainable = trainable;
  int64_t size = 0;
  for (const auto& p : list) {
    if (size > 0 && size + p.param.numel() > bucket) {
      out.push_back(current);
      current.params.clear();
      size = 0;
    }
    current.params.push_back(p);
    size += p.param.numel();
  }
  if (!current.params.empty()) out.push_back(current);
}

}  // namespace

std::vector<GroupSpec> layout_groups(const std::vector<NamedParam>& params,
                                     const std::vector<std::vector<NamedParam>>& units, int stage,
                                     int64_t bucket_numel) {
  // Owner unit of each parameter; -2 when more than one unit uses it (tied).
  std::unordered_map<const void*, int> owner;
  if (stage == 3) {
    for (size_t u = 0; u < units.size(); ++u) {
      for (const auto& p : units[u]) {
        auto [it, inserted] = owner.emplace(key(p.param), static_cast<int>(u));
        if (!inserted && it->second != static_cast<int>(u)) it->second = -2;
      }
    }
  }
  std::vector<NamedParam> root_trainable, frozen;
  std::vector<GroupSpec> unit_groups(units.size());
  for (const auto& p : params) {
    const auto it = owner.find(key(p.param));
    if (!p.param.requires_grad()) {
      frozen.push_back(p);
    } else if (it == owner.end() || it->second < 0) {
      root_trainable.push_back(p);
    } else {
      unit_groups[it->second].params.push_back(p);
    }
  }
  std::vector<GroupSpec> out;
  add_buckets(root_trainable, true, bucket_numel, out);
  for (size_t u = 0; u < unit_groups.size(); ++u) {
    if (unit_groups[u].params.empty()) continue;
    unit_groups[u].sharded = true;
    unit_groups[u].unit = static_cast<int>(u);
    out.push_back(unit_groups[u]);
  }
  add_buckets(frozen, false, bucket_numel, out);
  return out;
}

}  // namespace zeroshard
