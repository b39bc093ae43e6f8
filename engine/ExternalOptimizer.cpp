#include "engine/ExternalOptimizer.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <ATen/ATen.h>

#include "common/Error.h"
#include "offload/IoEngine.h"
#include "offload/PinnedPool.h"
#include "offload/Swapper.h"

namespace zeroshard {

ExternalOptimizer::ExternalOptimizer(std::string name, Tier tier, MemoryLedger* ledger,
                                     std::optional<ExternalStateSwap> swap)
    : name_(std::move(name)),
      tier_(tier),
      ledger_(ledger),
      state_entry_(ledger, tier, Kind::OptimizerStates, 0),
      swap_(std::move(swap)) {
  if (swap_ && swap_->sub_group_numel < 1) {
    fail("zero_optimization.sub_group_size: {} is not allowed; use >= 1", swap_->sub_group_numel);
  }
}

ExternalOptimizer::~ExternalOptimizer() = default;

void ExternalOptimizer::add_group(const at::Tensor& shard, std::vector<HyperSpan> spans) {
  at::Tensor master = fp32_master(shard, tier_ == Tier::Host);
  if (!master.is_same(shard)) {
    master_entries_.emplace_back(ledger_, tier_, Kind::MasterParams, master.numel() * 4);
  }
  shards_.push_back(shard);
  masters_.push_back(master);
  spans_.push_back(std::move(spans));
  if (!swap_) return;
  if (hooked_) fail("ExternalOptimizer: add_group after the hooks were set");
  const int64_t n = shard.numel();
  for (int64_t off = 0; off < n; off += swap_->sub_group_numel)
    regions_.push_back({shards_.size() - 1, off, std::min(swap_->sub_group_numel, n - off)});
}

void ExternalOptimizer::add_param_pieces(size_t group, std::vector<ParamPiece> pieces,
                                         size_t params) {
  (void)params;
  if (pieces_.size() <= group) pieces_.resize(group + 1);
  pieces_[group] = std::move(pieces);
}

void ExternalOptimizer::set_hooks(ExternalOptimizerHooks hooks) {
  hooks_ = std::move(hooks);
  hooked_ = true;
  if (swap_) open_swap();
  count_state();
}

void ExternalOptimizer::open_swap() {
  if (!hooks_.step_region || !hooks_.release_state) {
    fail(
        "config key 'zero_optimization.offload_optimizer.device' is 'nvme' with optimizer {}, "
        "whose update needs every group's whole parameters in one step; allowed: cpu or none",
        name_);
  }
  swapped_names_ = hooks_.state_names();
  if (swapped_names_.empty()) return;  // nothing per element (SGD without momentum)
  const auto arrays = static_cast<int64_t>(swapped_names_.size());
  std::vector<int64_t> bytes;
  int64_t largest = 0, total = 0;
  for (const StateRegion& r : regions_) {
    bytes.push_back(4 * arrays * r.numel);
    largest = std::max(largest, r.numel);
    total += r.numel;
  }
  pool_ = std::make_unique<PinnedPool>(std::max<int64_t>(1, swap_->buffer_count),
                                       4 * arrays * largest, ledger_, swap_->page_lock);
  swap_->io->register_buffers(pool_->all());
  swapper_ = std::make_unique<Swapper>(swap_->io, swap_->dir, "optimizer", bytes, nullptr,
                                       Kind::OptimizerStates);
  nvme_entry_ = LedgerEntry(ledger_, Tier::Nvme, Kind::OptimizerStates, 4 * arrays * total);
  // The state as the class holds it now: zeros, or what its constructor made (Adagrad's
  // initial accumulator), one group at a time; then the hooks drop theirs.
  for (size_t g = 0; g < groups(); ++g) {
    at::Tensor held = at::empty({arrays, group_numel(g)}, at::kFloat);
    std::vector<at::Tensor> rows;
    std::vector<const float*> pointers;
    for (int64_t a = 0; a < arrays; ++a) {
      rows.push_back(held[a]);
      pointers.push_back(rows.back().data_ptr<float>());
    }
    hooks_.read_state(g, rows);
    fill_regions(g, pointers);
  }
  hooks_.release_state();
}

std::vector<size_t> ExternalOptimizer::regions_of(size_t group) const {
  std::vector<size_t> order;
  for (size_t r = 0; r < regions_.size(); ++r)
    if (regions_[r].group == group) order.push_back(r);
  return order;
}

std::vector<at::Tensor> ExternalOptimizer::region_arrays(size_t region, void* buffer) const {
  const int64_t n = regions_.at(region).numel;
  std::vector<at::Tensor> arrays;
  for (size_t a = 0; a < swapped_names_.size(); ++a)
    arrays.push_back(at::from_blob(static_cast<float*>(buffer) + a * n, {n}, at::kFloat));
  return arrays;
}

void ExternalOptimizer::fill_regions(size_t group, const std::vector<const float*>& arrays) {
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

void ExternalOptimizer::drain_regions(size_t group, const std::vector<float*>& arrays) {
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

const ExternalOptimizerHooks& ExternalOptimizer::hooks() const {
  if (!hooked_) {
    fail(
        "optimizer.type '{}' is a torch.optim class, which the Python package steps "
        "(zeroshard.initialize); allowed in a LibTorch program: optimizer.type Adam or AdamW",
        name_);
  }
  return hooks_;
}

void ExternalOptimizer::write_back(size_t group) {
  at::Tensor& shard = shards_[group];
  if (masters_[group].data_ptr() != shard.data_ptr()) shard.copy_(masters_[group]);
}

void ExternalOptimizer::count_state() {
  state_entry_.resize(hooks_.state_bytes ? hooks_.state_bytes() : 0);
}

void ExternalOptimizer::step(const std::vector<at::Tensor>& grads, double grad_scale,
                             const std::vector<AdamHyper>& hypers) {
  const ExternalOptimizerHooks& h = hooks();
  std::vector<at::Tensor> scaled;
  for (size_t i = 0; i < grads.size(); ++i) {
    at::Tensor g = grads[i];
    if (g.device() != masters_.at(i).device()) g = g.to(masters_[i].device());
    if (grad_scale != 1.0) g.mul_(grad_scale);
    scaled.push_back(g);
  }
  ++steps_;
  if (!swapper_) {
    h.step(scaled, hypers);
  } else {  // one pipeline over every region of every group, reads running ahead
    std::vector<size_t> order(regions_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    swapper_->update_each(order, *pool_, [&](size_t r, void* buffer) {
      h.step_region(r, scaled[regions_[r].group], hypers, region_arrays(r, buffer));
    });
  }
  for (size_t i = 0; i < shards_.size(); ++i) write_back(i);
  count_state();
}

void ExternalOptimizer::reload_master(size_t group) {
  if (masters_.at(group).data_ptr() != shards_.at(group).data_ptr())
    masters_[group].copy_(shards_[group]);
}

std::vector<std::string> ExternalOptimizer::state_names() const {
  return hooks().state_names();
}

void ExternalOptimizer::read_state(size_t group, const std::vector<float*>& arrays) {
  const int64_t n = group_numel(group);
  if (arrays.empty()) fail("ExternalOptimizer::read_state: no array for the master");
  host_floats(arrays[0], n).copy_(masters_.at(group));
  if (swapper_) return drain_regions(group, {arrays.begin() + 1, arrays.end()});
  std::vector<at::Tensor> state;
  for (size_t a = 1; a < arrays.size(); ++a) state.push_back(host_floats(arrays[a], n));
  hooks().read_state(group, state);
}

void ExternalOptimizer::write_state(size_t group, const std::vector<std::string>& names,
                                    const std::vector<const float*>& arrays) {
  check_state_names(names, state_names(), name_.c_str());
  const int64_t n = group_numel(group);
  if (arrays.size() != names.size() + 1) {
    fail("ExternalOptimizer::write_state: {} arrays for {} names", arrays.size(), names.size());
  }
  masters_.at(group).copy_(host_floats(arrays[0], n));
  write_back(group);
  if (swapper_) fill_regions(group, {arrays.begin() + 1, arrays.end()});
  std::vector<at::Tensor> state;  // with NVMe the hooks take only what is not per element
  for (size_t a = 1; a < arrays.size(); ++a) state.push_back(host_floats(arrays[a], n));
  hooks().write_state(group, state);
  count_state();
}

std::string ExternalOptimizer::scalar_state() const {
  return hooks().scalar_state();
}

void ExternalOptimizer::set_scalar_state(const std::string& json) {
  hooks().set_scalar_state(json, steps_);
}

}  // namespace zeroshard
