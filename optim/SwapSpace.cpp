#include "optim/SwapSpace.h"

#include <fmt/format.h>

namespace zeroshard {

SwapSpace::SwapSpace(IoOptions io, int rank) : options_(io), rank_(rank) {}

// The directories go before the engine that wrote into them.
SwapSpace::~SwapSpace() {
  dirs_.clear();
  io_.reset();
}

const std::string& SwapSpace::open_dir(const std::string& nvme_path) {
  if (!io_) io_ = std::make_unique<IoEngine>(options_);
  dirs_.push_back(std::make_unique<SwapDir>(nvme_path, fmt::format("rank{}", rank_)));
  return dirs_.back()->path();
}

}  // namespace zeroshard
