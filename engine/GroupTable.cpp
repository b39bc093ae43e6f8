#include "engine/GroupTable.h"

#include "common/Error.h"

namespace zeroshard {

GroupId GroupTable::add(GroupRecord record, bool trainable) {
  const GroupId id(groups_.size());
  if (record.coordinator_unit) {
    coordinator_units_.at(record.unit.value().value).push_back(*record.coordinator_unit);
  }
  if (trainable) {
    record.trainable = TrainableId(trainable_.size());
    trainable_.push_back(id);
  }
  groups_.push_back(std::move(record));
  return id;
}

const std::vector<CoordinatorUnit>& GroupTable::coordinator_units(UnitId unit) const {
  if (unit.value >= coordinator_units_.size()) {
    fail("unit {} does not exist; this model has {} units", unit.value, coordinator_units_.size());
  }
  return coordinator_units_[unit.value];
}

std::optional<UnitId> GroupTable::unit_of(const torch::nn::Module& module) const {
  const auto it = unit_of_module_.find(&module);
  if (it == unit_of_module_.end()) return std::nullopt;
  return it->second;
}

}  // namespace zeroshard
