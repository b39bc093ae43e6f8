#pragma once
// The engine's flat groups and the index spaces over them:
//   group              its position here (every group, trainable or frozen);
//   trainable group    its position in the optimizer and the GradReducer;
//   coordinator unit   a stage-3 unit group's position in the ParamCoordinator;
//   unit               one the caller declared or engine/UnitPartition.h made: a stage-3
//                      unit has up to two groups (its trainable and its frozen parameters).
// It also names the model's parameters: each once, in registration order, and the other
// names tied ones are reached by (checkpoints record both).
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "sharding/FlatParamGroup.h"

namespace zeroshard {

struct GroupRecord {
  std::unique_ptr<FlatParamGroup> flat;
  int coordinator_unit = -1;  // -1: not a stage-3 unit group
  int trainable = -1;         // its trainable-group index; -1: frozen
  int unit = -1;              // its unit, for stage-3 unit groups
};

class GroupTable {
 public:
  void set_unit_count(size_t units) { coordinator_units_.assign(units, {}); }
  // Appends a group and returns its index: a trainable one gets the next trainable
  // index, a stage-3 unit group (coordinator_unit set) joins its unit's list.
  size_t add(GroupRecord record, bool trainable);
  void map_module(const torch::nn::Module* module, size_t unit) { unit_of_module_[module] = unit; }

  size_t size() const { return groups_.size(); }
  const GroupRecord& operator[](size_t group) const { return groups_[group]; }
  std::vector<GroupRecord>::const_iterator begin() const { return groups_.begin(); }
  std::vector<GroupRecord>::const_iterator end() const { return groups_.end(); }

  // Per trainable group: its group.
  const std::vector<size_t>& trainable() const { return trainable_; }
  const GroupRecord& of_trainable(size_t t) const { return groups_[trainable_.at(t)]; }
  FlatParamGroup& trainable_group(size_t t) const { return *of_trainable(t).flat; }
  int coordinator_unit_of_trainable(size_t t) const { return of_trainable(t).coordinator_unit; }

  size_t unit_count() const { return coordinator_units_.size(); }
  // A unit's coordinator units (none for a unit without parameters); fails naming the
  // unit when it does not exist.
  const std::vector<int>& coordinator_units(size_t unit) const;
  std::optional<size_t> unit_of(const torch::nn::Module& module) const;

  void set_params(std::vector<NamedParam> params) { params_ = std::move(params); }
  const std::vector<NamedParam>& params() const { return params_; }
  void set_aliases(std::vector<std::pair<std::string, std::string>> aliases) {
    aliases_ = std::move(aliases);
  }
  // (name, first name) for every parameter reachable under a second name.
  const std::vector<std::pair<std::string, std::string>>& aliases() const { return aliases_; }

 private:
  std::vector<GroupRecord> groups_;
  std::vector<size_t> trainable_;
  std::vector<std::vector<int>> coordinator_units_;
  std::unordered_map<const torch::nn::Module*, size_t> unit_of_module_;
  std::vector<NamedParam> params_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

}  // namespace zeroshard
