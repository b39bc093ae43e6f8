#include "optim/ExternalOptimizer.h"

#include <ATen/ATen.h>

#include "common/Error.h"

namespace zeroshard {

ExternalOptimizer::ExternalOptimizer(std::string name, Tier tier, MemoryLedger* ledger,
                                     std::optional<ExternalStateSwap> swap)
    : name_(std::move(name)),
      tier_(tier),
      ledger_(ledger),
      state_entry_(ledger, tier, Kind::OptimizerStates, 0) {
  if (swap) paged_ = std::make_unique<PagedState>(std::move(*swap));
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
  if (paged_) paged_->add_group(shards_.size() - 1, shard.numel());
}

const std::vector<StateRegion>& ExternalOptimizer::regions() const {
  static const std::vector<StateRegion> none;
  return paged_ ? paged_->regions() : none;
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
  if (paged_) open_swap();
  count_state();
}

void ExternalOptimizer::open_swap() {
  if (!hooks_.step_region || !hooks_.release_state) {
    fail(
        "config key 'zero_optimization.offload_optimizer.device' is 'nvme' with optimizer {}, "
        "whose update needs every group's whole parameters in one step; allowed: cpu or none",
        name_);
  }
  const size_t arrays = hooks_.state_names().size();
  paged_->open(arrays, ledger_);
  if (!paged_->is_open()) return;
  // The state as the class holds it now: zeros, or what its constructor made (Adagrad's
  // initial accumulator), one group at a time; then the hooks drop theirs.
  for (size_t g = 0; g < groups(); ++g) {
    at::Tensor held = at::empty({static_cast<int64_t>(arrays), group_numel(g)}, at::kFloat);
    std::vector<at::Tensor> rows;
    std::vector<const float*> pointers;
    for (size_t a = 0; a < arrays; ++a) {
      rows.push_back(held[static_cast<int64_t>(a)]);
      pointers.push_back(rows.back().data_ptr<float>());
    }
    hooks_.read_state(g, rows);
    paged_->fill(g, pointers);
  }
  hooks_.release_state();
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
  if (paged()) {  // one pipeline over every region, reads running ahead
    paged_->update_all([&](size_t r, const std::vector<at::Tensor>& arrays) {
      h.step_region(r, scaled[paged_->regions()[r].group], hypers, arrays);
    });
  } else {
    h.step(scaled, hypers);
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
  if (paged()) return paged_->drain(group, {arrays.begin() + 1, arrays.end()});
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
  if (paged()) paged_->fill(group, {arrays.begin() + 1, arrays.end()});
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
