#include "optim/PagedState.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <ATen/ATen.h>

#include "common/Error.h"
#include "offload/IoEngine.h"
#include "offload/PinnedPool.h"
#include "offload/Swapper.h"

namespace zeroshard {

PagedState::PagedState(ExternalStateSwap options) : options_(std::move(options)) {
  if (options_.sub_group_numel < 1) {
    fail("zero_optimization.sub_group_size: {} is not allowed; use >= 1", options_.sub_group_numel);
  }
}

PagedState::~PagedState() = default;

void PagedState::add_group(size_t group, int64_t numel) {
  if (swapper_) fail("PagedState: add_group after open");
  for (int64_t off = 0; off < numel; off += options_.sub_group_numel)
    regions_.push_back({group, off, std::min(options_.sub_group_numel, numel - off)});
}

void PagedState::open(size_t arrays, MemoryLedger* ledger) {
  arrays_ = arrays;
  if (arrays == 0) return;  // nothing per element (SGD without momentum)
  const auto per_element = static_cast<int64_t>(4 * arrays);
  std::vector<int64_t> bytes;
  int64_t largest = 0, total = 0;
  for (const StateRegion& r : regions_) {
    bytes.push_back(per_element * r.numel);
    largest = std::max(largest, r.numel);
    total += r.numel;
  }
  pool_ = std::make_unique<PinnedPool>(std::max<int64_t>(1, options_.buffer_count),
                                       per_element * largest, ledger, options_.page_lock);
  options_.io->register_buffers(pool_->all());
  swapper_ = std::make_unique<Swapper>(options_.io, options_.dir, "optimizer", bytes, nullptr,
                                       Kind::OptimizerStates);
  entry_ = LedgerEntry(ledger, Tier::Nvme, Kind::OptimizerStates, per_element * total);
}

std::vector<size_t> PagedState::regions_of(size_t group) const {
  std::vector<size_t> order;
  for (size_t r = 0; r < regions_.size(); ++r)
    if (regions_[r].group == group) order.push_back(r);
  return order;
}

std::vector<at::Tensor> PagedState::arrays_over(size_t region, void* buffer) const {
  const int64_t n = regions_.at(region).numel;
  std::vector<at::Tensor> arrays;
  for (size_t a = 0; a < arrays_; ++a)
    arrays.push_back(at::from_blob(static_cast<float*>(buffer) + a * n, {n}, at::kFloat));
  return arrays;
}

void PagedState::update_all(const Update& update) {
  std::vector<size_t> order(regions_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  swapper_->update_each(order, *pool_,
                        [&](size_t r, void* buffer) { update(r, arrays_over(r, buffer)); });
}

void PagedState::fill(size_t group, const std::vector<const float*>& arrays) {
  swapper_->update_each(
      regions_of(group), *pool_,
      [&](size_t r, void* buffer) {
        const StateRegion& s = regions_[r];
        auto* f = static_cast<float*>(buffer);
        for (size_t a = 0; a < arrays.size(); ++a)
          std::memcpy(f + a * s.numel, arrays[a] + s.offset, s.numel * 4);
      },
      Swapper::Pass::Fill);
}

void PagedState::drain(size_t group, const std::vector<float*>& arrays) {
  swapper_->update_each(
      regions_of(group), *pool_,
      [&](size_t r, void* buffer) {
        const StateRegion& s = regions_[r];
        const auto* f = static_cast<const float*>(buffer);
        for (size_t a = 0; a < arrays.size(); ++a)
          std::memcpy(arrays[a] + s.offset, f + a * s.numel, s.numel * 4);
      },
      Swapper::Pass::Drain);
}

}  // namespace zeroshard
