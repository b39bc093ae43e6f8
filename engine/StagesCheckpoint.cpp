#include "engine/StagesCheckpoint.h"

#include <utility>

#include "common/Error.h"

namespace zeroshard {

StagesCheckpoint::StagesCheckpoint(std::vector<std::unique_ptr<CheckpointSource>> parts,
                                   const std::string& dir, const std::string& tag)
    : parts_(std::move(parts)), manifest_(parts_.at(0)->manifest()), origin_(dir + "/" + tag) {
  manifest_.tag = tag;
  manifest_.groups.clear();
  manifest_.buffers.clear();
  manifest_.aliases.clear();
  const auto hold = [&](const std::string& name, size_t part) {
    const auto [it, added] = holder_.emplace(name, part);
    if (!added && it->second != part) {
      fail(
          "checkpoint '{}': pipeline stages {} and {} both hold '{}' (each stage's module names "
          "its own parameters); it loads only at the number of stages it was saved with",
          origin_, it->second, part, name);
    }
  };
  for (size_t k = 0; k < parts_.size(); ++k) {
    const Manifest& m = parts_[k]->manifest();
    first_group_.push_back(manifest_.groups.size());
    for (const SavedGroup& g : m.groups) {
      for (const SavedParam& p : g.params) hold(p.name, k);
      manifest_.groups.push_back(g);
    }
    for (const auto& alias : m.aliases) manifest_.aliases.push_back(alias);
    manifest_.has_buffers = manifest_.has_buffers || m.has_buffers;
    for (const SavedBuffer& b : m.buffers) {
      if (buffers_.emplace(b.name, k).second) manifest_.buffers.push_back(b);
    }
  }
}

size_t StagesCheckpoint::part_of(const std::string& name) const {
  const auto it = holder_.find(name);
  if (it == holder_.end()) {
    fail("checkpoint '{}' has no parameter '{}' in any pipeline stage's part", origin_, name);
  }
  return it->second;
}

const SavedParam& StagesCheckpoint::param(const std::string& name, size_t* group) const {
  const size_t part = part_of(name);
  size_t own = 0;
  const SavedParam& p = parts_[part]->param(name, &own);
  if (group) *group = first_group_[part] + own;
  return p;
}

void StagesCheckpoint::read(const std::string& name, int array, int64_t begin, int64_t count,
                            float* out) const {
  parts_[part_of(name)]->read(name, array, begin, count, out);
}

void StagesCheckpoint::read_buffer(const SavedBuffer& buffer, void* out) const {
  const auto it = buffers_.find(buffer.name);
  if (it == buffers_.end()) {
    fail("checkpoint '{}' has no buffer '{}' in any pipeline stage's part", origin_, buffer.name);
  }
  parts_[it->second]->read_buffer(buffer, out);
}

}  // namespace zeroshard
