#pragma once
// The engine's flat groups and the index spaces over them:
//   group              its position here (every group, trainable or frozen);
//   trainable group    its position in the optimizer and the GradReducer;
//   coordinator unit   a stage-3 unit group's position in the ParamCoordinator;
//   unit               one the caller declared or engine/UnitPartition.h made: a stage-3
//                      unit has up to four groups (its trainable and its frozen parameters,
//                      each with the experts' apart: engine/GroupLayout.h).
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

// A position in one of the index spaces above, as a type of its own: a trainable-group
// index cannot be passed where a group or a unit is meant. `value` is the plain index
// the layers below (sharding/) take.
template <class Space>
struct Index {
  size_t value = 0;
  constexpr explicit Index(size_t v = 0) : value(v) {}
  bool operator==(Index other) const { return value == other.value; }
  bool operator!=(Index other) const { return value != other.value; }
};
using GroupId = Index<struct GroupSpace>;
using TrainableId = Index<struct TrainableSpace>;
using CoordinatorUnit = Index<struct CoordinatorSpace>;
using UnitId = Index<struct UnitSpace>;

struct GroupRecord {
  std::unique_ptr<FlatParamGroup> flat;
  std::optional<CoordinatorUnit> coordinator_unit;  // stage-3 unit groups only
  std::optional<TrainableId> trainable;             // none: frozen
  std::optional<UnitId> unit;                       // its unit, for stage-3 unit groups
  bool expert = false;  // expert parameters: reduced and sharded over the edp ranks
  // The coordinator unit as the layers below take it: -1 for none.
  int coordinator_unit_index() const {
    return coordinator_unit ? static_cast<int>(coordinator_unit->value) : -1;
  }
};

class GroupTable {
 public:
  void set_unit_count(size_t units) { coordinator_units_.assign(units, {}); }
  // Appends a group and returns its index: a trainable one gets the next trainable
  // index, a stage-3 unit group (coordinator_unit set) joins its unit's list.
  GroupId add(GroupRecord record, bool trainable);
  void map_module(const torch::nn::Module* module, UnitId unit) { unit_of_module_[module] = unit; }

  size_t size() const { return groups_.size(); }
  const GroupRecord& operator[](GroupId group) const { return groups_.at(group.value); }
  std::vector<GroupRecord>::const_iterator begin() const { return groups_.begin(); }
  std::vector<GroupRecord>::const_iterator end() const { return groups_.end(); }

  // Per trainable group: its group.
  const std::vector<GroupId>& trainable() const { return trainable_; }
  const GroupRecord& of_trainable(TrainableId t) const { return (*this)[trainable_.at(t.value)]; }
  FlatParamGroup& trainable_group(TrainableId t) const { return *of_trainable(t).flat; }
  std::optional<CoordinatorUnit> coordinator_unit_of(TrainableId t) const {
    return of_trainable(t).coordinator_unit;
  }

  size_t unit_count() const { return coordinator_units_.size(); }
  // A unit's coordinator units (none for a unit without parameters); fails naming the
  // unit when it does not exist.
  const std::vector<CoordinatorUnit>& coordinator_units(UnitId unit) const;
  std::optional<UnitId> unit_of(const torch::nn::Module& module) const;

  void set_params(std::vector<NamedParam> params) { params_ = std::move(params); }
  const std::vector<NamedParam>& params() const { return params_; }
  // {name: dimension} of the parameters split across the tensor-parallel ranks.
  std::unordered_map<std::string, int> tensor_parallel_dims() const {
    std::unordered_map<std::string, int> dims;
    for (const NamedParam& p : params_)
      if (p.tensor_parallel()) dims.emplace(p.name, p.tensor_parallel_dim);
    return dims;
  }
  void set_aliases(std::vector<std::pair<std::string, std::string>> aliases) {
    aliases_ = std::move(aliases);
  }
  // (name, first name) for every parameter reachable under a second name.
  const std::vector<std::pair<std::string, std::string>>& aliases() const { return aliases_; }

 private:
  std::vector<GroupRecord> groups_;
  std::vector<GroupId> trainable_;
  std::vector<std::vector<CoordinatorUnit>> coordinator_units_;
  std::unordered_map<const torch::nn::Module*, UnitId> unit_of_module_;
  std::vector<NamedParam> params_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

}  // namespace zeroshard
