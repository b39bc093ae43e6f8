// zeroshard::Engine's factory, and the engine's questions: counts, the plan, reports.
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
  return std::make_unique<EngineImpl>(std::move(module), config, std::move(options));
}

Engine::~Engine() = default;

torch::nn::Module& EngineImpl::module() {
  if (!module_) fail("this Engine was built from a parameter list, not a torch::nn::Module");
  return *module_;
}

size_t EngineImpl::param_group_count() const {
  return param_groups_.size();
}
const ParamGroupOptions& EngineImpl::param_group(size_t group) const {
  return param_groups_.options(group);
}
int64_t EngineImpl::micro_steps() const {
  return pipeline_->micro_steps();
}

void EngineImpl::reduce_across_shards(at::Tensor& tensor) {
  if (plan_.settings.stage.shards_optimizer()) comms_->shards().all_reduce_sum(tensor).wait();
}

ExternalOptimizer& EngineImpl::external_optimizer() {
  ExternalOptimizer* external = pipeline_->external();
  if (!external) {
    fail("this engine steps zeroshard's own {}, not a torch.optim class",
         plan_.settings.optimizer.type);
  }
  return *external;
}

int64_t EngineImpl::global_steps() const {
  return pipeline_->global_steps();
}
int64_t EngineImpl::skipped_steps() const {
  return pipeline_->skipped_steps();
}
int64_t EngineImpl::schedule_steps() const {
  return pipeline_->schedule_steps();
}
const Plan& EngineImpl::plan() const {
  return plan_;
}
const Config& EngineImpl::config() const {
  return plan_.config;
}
int EngineImpl::rank() const {
  return dist_.env.rank;
}
int EngineImpl::world_size() const {
  return dist_.env.world_size;
}
int EngineImpl::data_parallel_rank() const {
  return dist_.dims.coordinate(Dim::Dp);
}
int EngineImpl::data_parallel_size() const {
  return dist_.dims.size(Dim::Dp);
}
int EngineImpl::tensor_parallel_size() const {
  return dist_.dims.size(Dim::Tp);
}
int EngineImpl::pipeline_parallel_size() const {
  return dist_.dims.size(Dim::Pp);
}
int EngineImpl::sequence_parallel_size() const {
  return static_cast<int>(plan_.settings.sequence_parallel_size);
}
int EngineImpl::pipeline_stage() const {
  return dist_.dims.coordinate(Dim::Pp);
}
MemoryReport EngineImpl::memory_report() const {
  return memory_detail().to_public();
}

void EngineImpl::set_activation_shape(const std::string& hf_config_json,
                                      const std::string& attn_implementation, int64_t seq,
                                      int64_t micro_batch, bool activation_checkpointing,
                                      bool has_head) {
  ModelSpec shaped = spec_from_hf_model(hf_config_json, attn_implementation);
  shaped.has_head = has_head;
  TrainingShape batch;
  batch.seq = seq;
  batch.micro_batch = micro_batch;
  batch.activation_checkpointing = activation_checkpointing;
  batch.sequence_parallel = sequence_parallel_size();  // `seq` is the whole sequence's
  batch.ring_attention = plan_.config.ring_attention;
  device_.activations = std::make_pair(shaped, batch);
}
void EngineImpl::set_pipeline_in_flight(int64_t in_flight, int64_t micro_batches) {
  pipeline_in_flight_ = {in_flight, micro_batches};
}

MemoryLedger& EngineImpl::ledger() {
  return ledger_;
}

void EngineImpl::set_aliases(std::vector<std::pair<std::string, std::string>> aliases) {
  groups_.set_aliases(std::move(aliases));
}

}  // namespace zeroshard
