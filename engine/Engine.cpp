// zeroshard::Engine's public calls: each forwards to EngineImpl (engine/EngineImpl.h),
// so the public header carries no member of the implementation.
#include "engine/Engine.h"

#include "engine/EngineImpl.h"

namespace zeroshard {

Engine::Engine(std::shared_ptr<torch::nn::Module> module, const Config& config,
               EngineOptions options)
    : impl_(std::make_unique<EngineImpl>(std::move(module), config, std::move(options))) {}

Engine::Engine(std::vector<NamedParam> params, std::vector<std::vector<NamedParam>> unit_params,
               const Config& config, std::optional<LaunchEnv> launch,
               std::vector<ParamGroup> param_groups, MaterializeParams materialize,
               std::vector<NamedBuffer> buffers)
    : impl_(std::make_unique<EngineImpl>(std::move(params), std::move(unit_params), config,
                                         std::move(launch), std::move(param_groups),
                                         std::move(materialize), std::move(buffers))) {}

Engine::~Engine() = default;

torch::nn::Module& Engine::module() {
  return impl_->module();
}
at::Tensor Engine::run_unit(const torch::nn::Module& unit,
                            const std::function<at::Tensor()>& forward) {
  return impl_->run_unit(unit, forward);
}
void Engine::unit_forward_begin(size_t unit) {
  impl_->unit_forward_begin(unit);
}
void Engine::unit_forward_end(size_t unit) {
  impl_->unit_forward_end(unit);
}
void Engine::unit_backward_begin(size_t unit) {
  impl_->unit_backward_begin(unit);
}
void Engine::model_forward_begin() {
  impl_->model_forward_begin();
}
void Engine::model_forward_end(bool grad_enabled) {
  impl_->model_forward_end(grad_enabled);
}
int Engine::touch_unit(size_t unit, bool grad_enabled) {
  return impl_->touch_unit(unit, grad_enabled);
}
int Engine::unit_held(size_t unit) const {
  return impl_->unit_held(unit);
}
void Engine::gather_unit(size_t unit) {
  impl_->gather_unit(unit);
}
void Engine::release_unit(size_t unit) {
  impl_->release_unit(unit);
}
void Engine::commit_parameters(int src_rank) {
  impl_->commit_parameters(src_rank);
}
void Engine::backward(const at::Tensor& loss) {
  impl_->backward(loss);
}
std::vector<NamedParam> Engine::full_parameters() {
  return impl_->full_parameters();
}
bool Engine::step() {
  return impl_->step();
}
void Engine::zero_grad() {
  impl_->zero_grad();
}

double Engine::loss_scale() const {
  return impl_->loss_scale();
}
double Engine::global_grad_norm() const {
  return impl_->global_grad_norm();
}
double Engine::lr() const {
  return impl_->lr();
}
size_t Engine::param_group_count() const {
  return impl_->param_group_count();
}
const ParamGroupOptions& Engine::param_group(size_t group) const {
  return impl_->param_group(group);
}
void Engine::set_param_group(size_t group, const ParamGroupOptions& options) {
  impl_->set_param_group(group, options);
}
std::vector<AdamHyper> Engine::param_group_hypers() const {
  return impl_->param_group_hypers();
}
int64_t Engine::optimizer_steps() const {
  return impl_->optimizer_steps();
}
const Plan& Engine::plan() const {
  return impl_->plan();
}
const Config& Engine::config() const {
  return impl_->config();
}
int Engine::rank() const {
  return impl_->rank();
}
int Engine::world_size() const {
  return impl_->world_size();
}
MemoryReport Engine::memory_report() const {
  return impl_->memory_report();
}
int64_t Engine::bytes_sent() const {
  return impl_->bytes_sent();
}
void Engine::barrier() {
  impl_->barrier();
}
MemoryLedger& Engine::ledger() {
  return impl_->ledger();
}

std::string Engine::save_checkpoint(const std::string& dir, std::string tag,
                                    const std::string& client_state_json,
                                    const std::string& lr_scheduler_json) {
  return impl_->save_checkpoint(dir, std::move(tag), client_state_json, lr_scheduler_json);
}
Engine::Loaded Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  return impl_->load_checkpoint(dir, tag);
}
void Engine::set_aliases(std::vector<std::pair<std::string, std::string>> aliases) {
  impl_->set_aliases(std::move(aliases));
}

}  // namespace zeroshard
