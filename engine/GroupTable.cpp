#include "engine/GroupTable.h"

#include "common/Error.h"

namespace zeroshard {

size_t GroupTable::add(GroupRecord record, bool trainable) {
  if (record.coordinator_unit >= 0) {
    coordinator_units_.at(static_cast<size_t>(record.unit)).push_back(record.coordinator_unit);
  }
  if (trainable) {
    record.trainable = static_cast<int>(trainable_.size());
    trainable_.push_back(groups_.size());
  }
  groups_.push_back(std::move(record));
  return groups_.size() - 1;
}

const std::vector<int>& GroupTable::coordinator_units(size_t unit) const {
  if (unit >= coordinator_units_.size()) {
    fail("unit {} does not exist; this model has {} units", unit, coordinator_units_.size());
  }
  return coordinator_units_[unit];
}

std::optional<size_t> GroupTable::unit_of(const torch::nn::Module& module) const {
  const auto it = unit_of_module_.find(&module);
  if (it == unit_of_module_.end()) return std::nullopt;
  return it->second;
}

}  // namespace zeroshard
