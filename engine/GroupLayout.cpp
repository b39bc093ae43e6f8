#include "engine/GroupLayout.h"

#include <unordered_map>

namespace zeroshard {
namespace {

const void* key(const at::Tensor& t) {
  return t.unsafeGetTensorImpl();
}

void add_buckets(const std::vector<NamedParam>& list, bool trainable, int64_t bucket,
                 std::vector<GroupSpec>& out, bool expert = false) {
  GroupSpec current;
  current.trainable = trainable;
  current.expert = expert;
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
                                     const std::vector<std::vector<NamedParam>>& units,
                                     ZeroStage stage, int64_t bucket_numel) {
  // Owner unit of each parameter; -2 when more than one unit uses it (tied).
  std::unordered_map<const void*, int> owner;
  if (stage.shards_parameters()) {
    for (size_t u = 0; u < units.size(); ++u) {
      for (const auto& p : units[u]) {
        auto [it, inserted] = owner.emplace(key(p.param), static_cast<int>(u));
        if (!inserted && it->second != static_cast<int>(u)) it->second = -2;
      }
    }
  }
  std::vector<NamedParam> root_trainable, root_experts, frozen;
  // Per unit: trainable, trainable experts', frozen, frozen experts'.
  std::vector<GroupSpec> unit_groups(4 * units.size());
  for (const auto& p : params) {
    const auto it = owner.find(key(p.param));
    const bool trainable = p.param.requires_grad();
    if (it == owner.end() || it->second < 0) {
      (trainable ? (p.expert ? root_experts : root_trainable) : frozen).push_back(p);
    } else {
      unit_groups[4 * it->second + (trainable ? 0 : 2) + (p.expert ? 1 : 0)].params.push_back(p);
    }
  }
  std::vector<GroupSpec> out;
  add_buckets(root_trainable, true, bucket_numel, out);
  add_buckets(root_experts, true, bucket_numel, out, /*expert=*/true);
  for (size_t g = 0; g < unit_groups.size(); ++g) {
    if (unit_groups[g].params.empty()) continue;
    unit_groups[g].sharded = true;
    unit_groups[g].trainable = g % 4 < 2;
    unit_groups[g].expert = g % 2 == 1;
    unit_groups[g].unit = static_cast<int>(g / 4);
    out.push_back(unit_groups[g]);
  }
  add_buckets(frozen, false, bucket_numel, out);
  return out;
}

}  // namespace zeroshard
