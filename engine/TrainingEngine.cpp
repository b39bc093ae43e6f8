// zeroshard::Engine's factory, and TrainingEngine's calls: each forwards to EngineImpl
// (engine/EngineImpl.h), so neither header carries a member of the implementation.
#include "engine/TrainingEngine.h"

#include "common/Error.h"
#include "engine/Communicators.h"
#include "engine/EngineImpl.h"
#include "engine/StepPipeline.h"
#include "plan/HfConfig.h"
#include "sharding/Collectives.h"

namespace zeroshard {

std::unique_ptr<Engine> Engine::create(std::shared_ptr<torch::nn::Module> module,
                                       const std::string& config_file, EngineOptions options) {
  const Config config = load_config_file(config_file).config;
  // Said here, on every rank alike, before any rank waits for the others.
  if (config.optimizer.external) {
    fail(
        "{}: config key 'optimizer.type' is '{}', a torch.optim class, which the Python package "
        "steps (zeroshard.initialize); allowed in a LibTorch program: Adam, AdamW or Lamb",
        config_file, config.optimizer.type);
  }
  return std::make_unique<TrainingEngine>(std::move(module), config, std::move(options));
}

Engine::~Engine() = default;

TrainingEngine::TrainingEngine(std::shared_ptr<torch::nn::Module> module, const Config& config,
                               EngineOptions options, std::optional<LaunchEnv> launch)
    : impl_(std::make_unique<EngineImpl>(std::move(module), config, std::move(options),
                                         std::move(launch))) {}

TrainingEngine::TrainingEngine(std::vector<NamedParam> params,
                               std::vector<std::vector<NamedParam>> unit_params,
                               const Config& config, std::optional<LaunchEnv> launch,
                               std::vector<ParamGroup> param_groups, MaterializeParams materialize,
                               std::vector<NamedBuffer> buffers, std::optional<AssumedBatch> batch)
    : impl_(std::make_unique<EngineImpl>(
          std::move(params), std::move(unit_params), config, std::move(launch),
          std::move(param_groups), std::move(materialize), std::move(buffers), std::move(batch))) {}

TrainingEngine::~TrainingEngine() = default;

torch::nn::Module& TrainingEngine::module() {
  return impl_->module();
}
at::Tensor TrainingEngine::run_unit(const torch::nn::Module& unit,
                                    const std::function<at::Tensor()>& forward) {
  return impl_->run_unit(unit, forward);
}
void TrainingEngine::unit_forward_begin(size_t unit) {
  impl_->unit_forward_begin(unit);
}
void TrainingEngine::unit_forward_end(size_t unit) {
  impl_->unit_forward_end(unit);
}
void TrainingEngine::unit_backward_begin(size_t unit) {
  impl_->unit_backward_begin(unit);
}

bool TrainingEngine::unit_inputs_need_grad(size_t unit) {
  return impl_->unit_inputs_need_grad(unit);
}

void TrainingEngine::unit_inputs_done(size_t unit) {
  impl_->unit_inputs_done(unit);
}
void TrainingEngine::model_forward_begin() {
  impl_->model_forward_begin();
}
void TrainingEngine::model_forward_end(bool grad_enabled) {
  impl_->model_forward_end(grad_enabled);
}
int TrainingEngine::touch_unit(size_t unit, bool grad_enabled) {
  return impl_->touch_unit(unit, grad_enabled);
}
int TrainingEngine::unit_held(size_t unit) const {
  return impl_->unit_held(unit);
}
void TrainingEngine::gather_unit(size_t unit) {
  impl_->gather_unit(unit);
}
void TrainingEngine::release_unit(size_t unit) {
  impl_->release_unit(unit);
}
void TrainingEngine::commit_parameters(int src_rank) {
  impl_->commit_parameters(src_rank);
}
void TrainingEngine::backward(const at::Tensor& loss, bool retain_graph) {
  impl_->backward(loss, retain_graph);
}
std::vector<NamedParam> TrainingEngine::full_parameters() {
  return impl_->full_parameters();
}
bool TrainingEngine::step() {
  return impl_->step();
}
void TrainingEngine::zero_grad() {
  impl_->zero_grad();
}

double TrainingEngine::loss_scale() const {
  return impl_->loss_scale();
}
double TrainingEngine::global_grad_norm() const {
  return impl_->global_grad_norm();
}
double TrainingEngine::lr() const {
  return impl_->lr();
}
size_t TrainingEngine::param_group_count() const {
  return impl_->param_group_count();
}
const ParamGroupOptions& TrainingEngine::param_group(size_t group) const {
  return impl_->param_group(group);
}
void TrainingEngine::set_param_group(size_t group, const ParamGroupOptions& options) {
  impl_->set_param_group(group, options);
}
std::vector<AdamHyper> TrainingEngine::param_group_hypers() const {
  return impl_->param_group_hypers();
}
int64_t TrainingEngine::micro_steps() const {
  return impl_->pipeline_->micro_steps();
}

void TrainingEngine::reduce_across_shards(at::Tensor& tensor) {
  if (impl_->plan_.settings.stage.shards_optimizer())
    impl_->comms_->shards().all_reduce_sum(tensor).wait();
}

ExternalOptimizer& TrainingEngine::external_optimizer() {
  ExternalOptimizer* external = impl_->pipeline_->external();
  if (!external) {
    fail("this engine steps zeroshard's own {}, not a torch.optim class",
         impl_->plan_.settings.optimizer.type);
  }
  return *external;
}

int64_t TrainingEngine::optimizer_steps() const {
  return impl_->optimizer_steps();
}
int64_t TrainingEngine::global_steps() const {
  return impl_->pipeline_->global_steps();
}
int64_t TrainingEngine::skipped_steps() const {
  return impl_->pipeline_->skipped_steps();
}
int64_t TrainingEngine::schedule_steps() const {
  return impl_->pipeline_->schedule_steps();
}
const Plan& TrainingEngine::plan() const {
  return impl_->plan();
}
const Config& TrainingEngine::config() const {
  return impl_->config();
}
int TrainingEngine::rank() const {
  return impl_->rank();
}
int TrainingEngine::world_size() const {
  return impl_->world_size();
}
MemoryReport TrainingEngine::memory_report() const {
  return impl_->memory_report().to_public();
}
MemoryDetail TrainingEngine::memory_detail() const {
  return impl_->memory_report();
}

void TrainingEngine::set_activation_shape(const std::string& hf_config_json,
                                          const std::string& attn_implementation, int64_t seq,
                                          int64_t micro_batch, bool activation_checkpointing) {
  const ModelSpec shaped = spec_from_hf_model(hf_config_json, attn_implementation);
  TrainingShape batch;
  batch.seq = seq;
  batch.micro_batch = micro_batch;
  batch.activation_checkpointing = activation_checkpointing;
  impl_->set_activation_shape(shaped, batch);
}
int64_t TrainingEngine::bytes_sent() const {
  return impl_->bytes_sent();
}
void TrainingEngine::barrier() {
  impl_->barrier();
}
MemoryLedger& TrainingEngine::ledger() {
  return impl_->ledger();
}

std::string TrainingEngine::save_checkpoint(const std::string& dir, std::string tag,
                                            const std::string& client_state_json,
                                            const std::string& lr_scheduler_json,
                                            const SaveOptions& options) {
  return impl_->save_checkpoint(dir, std::move(tag), client_state_json, lr_scheduler_json, options);
}
LoadedCheckpoint TrainingEngine::load_checkpoint(const std::string& dir, const std::string& tag,
                                                 const LoadOptions& options) {
  return impl_->load_checkpoint(dir, tag, options);
}
void TrainingEngine::set_aliases(std::vector<std::pair<std::string, std::string>> aliases) {
  impl_->set_aliases(std::move(aliases));
}

}  // namespace zeroshard
