#include "optim/SplitOptimizer.h"

#include "common/Error.h"

namespace zeroshard {

SplitOptimizer::SplitOptimizer(std::unique_ptr<ShardOptimizer> device,
                               std::unique_ptr<ShardOptimizer> host, std::vector<bool> on_host)
    : device_(std::move(device)), host_(std::move(host)), on_host_(std::move(on_host)) {}

void SplitOptimizer::add_group(const at::Tensor& shard, std::vector<HyperSpan> spans) {
  const size_t i = where_.size();
  if (i >= on_host_.size())
    fail("SplitOptimizer: group {} added, but the split names {} groups", i, on_host_.size());
  ShardOptimizer* to = on_host_[i] ? host_.get() : device_.get();
  where_.push_back({to, to->groups()});
  to->add_group(shard, std::move(spans));
}

const SplitOptimizer::Place& SplitOptimizer::place(size_t group) const {
  if (group >= where_.size()) fail("SplitOptimizer: group {} of {}", group, where_.size());
  return where_[group];
}

void SplitOptimizer::add_param_pieces(size_t group, std::vector<ParamPiece> pieces, size_t params) {
  const Place& p = place(group);
  p.optimizer->add_param_pieces(p.group, std::move(pieces), params);
}

void SplitOptimizer::step(const std::vector<at::Tensor>& grads, double grad_scale,
                          const std::vector<AdamHyper>& hypers) {
  std::vector<at::Tensor> on_device, on_host;
  for (size_t g = 0; g < where_.size(); ++g)
    (where_[g].optimizer == host_.get() ? on_host : on_device).push_back(grads.at(g));
  device_->step(on_device, grad_scale, hypers);
  host_->step(on_host, grad_scale, hypers);
}

void SplitOptimizer::reload_master(size_t group) {
  const Place& p = place(group);
  p.optimizer->reload_master(p.group);
}

int64_t SplitOptimizer::group_numel(size_t group) const {
  const Place& p = place(group);
  return p.optimizer->group_numel(p.group);
}

void SplitOptimizer::read_state(size_t group, const std::vector<float*>& arrays) {
  const Place& p = place(group);
  p.optimizer->read_state(p.group, arrays);
}

void SplitOptimizer::write_state(size_t group, const std::vector<std::string>& names,
                                 const std::vector<const float*>& arrays) {
  const Place& p = place(group);
  p.optimizer->write_state(p.group, names, arrays);
}

void SplitOptimizer::set_steps(int64_t steps) {
  device_->set_steps(steps);
  host_->set_steps(steps);
}

void SplitOptimizer::start() {
  device_->start();
  host_->start();
}

}  // namespace zeroshard
