#include "config/Config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/Error.h"

using namespace zeroshard;

namespace {

// The message of the Error that loading `yaml` throws ("" if it loads).
std::string load_error(const std::string& yaml) {
  try {
    load_config_string(yaml, "test.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing '" << part << "' in: " << text;
}

}  // namespace

TEST(Config, EmptyFileGivesDeepSpeedDefaults) {
  const Config c = load_config_string("", "empty").config;
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::None);
  EXPECT_EQ(c.aio.block_size, 1 << 20);
  EXPECT_EQ(c.compute_bytes(), 4);
}

TEST(Config, ReadsDeepSpeedJsonAsIs) {
  const auto loaded = load_config_string(R"({
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": 1.0,
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1}},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": 5e8,
      "stage3_prefetch_bucket_size": "auto",
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6}},
    "steps_per_print": 10
  })",
                                         "ds.json");
  const Config& c = loaded.config;
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_FALSE(c.gradient_accumulation_steps.has_value());  // auto
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.compute_bytes(), 2);
  EXPECT_DOUBLE_EQ(*c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(*c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_FALSE(c.zero.stage3_prefetch_bucket_size.has_value());
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Cpu);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::Nvme);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 6);
  ASSERT_EQ(loaded.warnings.size(), 1u);
  expect_contains(loaded.warnings[0], "steps_per_print");
}

TEST(Config, MisspelledKeySuggestsTheRealOne) {
  const std::string msg = load_error("zero_optimization:\n  stgae: 2\n");
  expect_contains(msg, "test.yaml");
  expect_contains(msg, "'zero_optimization.stgae' is not known");
  expect_contains(msg, "did you mean 'zero_optimization.stage'");
  expect_contains(load_error("gradient_acumulation_steps: 2\n"),
                  "did you mean 'gradient_accumulation_steps'");
}

// Found by the config fuzzer: YAML's explicit keys ("? ...") may be lists or mappings.
TEST(Config, AKeyThatIsNoPlainNameIsAClearError) {
  const std::string msg = load_error("optimizer:\n  params:\n    ? [lr, eps]\n    : 1\n");
  expect_contains(msg, "test.yaml: a config key under 'optimizer.params' is not a plain name");
  expect_contains(msg, "got 'a list'");
}

TEST(Config, UnknownKeyWithoutNeighbourListsAllowedKeys) {
  const std::string msg = load_error("aio:\n  something_else: 1\n");
  expect_contains(msg, "'aio.something_else' is not known");
  expect_contains(msg, "block_size, queue_depth");
}

TEST(Config, WrongTypeNamesKeyValueAndAllowed) {
  std::string msg = load_error("zero_optimization:\n  stage: two\n");
  expect_contains(msg, "'zero_optimization.stage'");
  expect_contains(msg, "'two'");
  expect_contains(msg, "integer 0..3 or auto");
  expect_contains(load_error("zero_optimization: {stage: 4}"), "integer 0..3");
  expect_contains(load_error("zero_optimization: {stage: 2.5}"), "'2.5'");
  expect_contains(load_error("bf16: {enabled: maybe}"), "true or false");
  expect_contains(load_error("aio: {block_size: 1000}"), "a multiple of 4096");
  expect_contains(load_error("optimizer: {params: {betas: [0.9]}}"), "two numbers");
  expect_contains(load_error("optimizer: {type: Sgd}"), "one of AdamW, Adam, Lamb, SGD");
  expect_contains(load_error("zero_optimization: {offload_optimizer: {device: gpu}}"),
                  "none, cpu, nvme or auto");
  expect_contains(load_error("zero_optimization: 3"), "must be a mapping");
  expect_contains(load_error("gradient_clipping: -1"), "'gradient_clipping'");
  expect_contains(load_error("fp16: {enabled: auto}"), "true or false");
  expect_contains(load_error("train_micro_batch_size_per_gpu:\n"), "has no value");
}

TEST(Config, ContradictionsAreErrors) {
  expect_contains(load_error("bf16: {enabled: true}\nfp16: {enabled: true}\n"),
                  "'bf16.enabled' and 'fp16.enabled' are both true");
  expect_contains(load_error("zero_optimization: {stage: 2, offload_param: {device: cpu}}"),
                  "parameter offload needs stage 3");
  expect_contains(load_error("zero_optimization: {stage: 0, offload_optimizer: {device: cpu}}"),
                  "optimizer offload needs stage 1, 2 or 3");
  expect_contains(load_error("zero_optimization: {stage: 3, offload_optimizer: {device: nvme}}"),
                  "'zero_optimization.offload_optimizer.nvme_path' is missing");
  // DeepSpeed's classes refuse a keyword of another scheduler, and need total_num_steps.
  expect_contains(load_error("scheduler: {type: WarmupCosineLR, params: {warmup_max_lr: 0.1, "
                             "total_num_steps: 10}}"),
                  "'scheduler.params.warmup_max_lr' is not a parameter of DeepSpeed's "
                  "WarmupCosineLR; allowed: total_num_steps, warmup_min_ratio");
  expect_contains(load_error("scheduler: {type: WarmupDecayLR, params: {warmup_num_steps: 20}}"),
                  "'scheduler.params.total_num_steps' is missing; WarmupDecayLR requires it");
  expect_contains(load_error("scheduler: {type: WarmupLR, params: {warmup_num_steps: 0}}"),
                  "'scheduler.params.warmup_num_steps': value '0' is not allowed");
  expect_contains(load_error("zero_optimization: {stage: 3, mics_shard_size: 0}"),
                  "'zero_optimization.mics_shard_size' is 0; allowed: -1");
  expect_contains(load_error("zero_optimization: {stage: 0, mics_shard_size: 2}"),
                  "sharding groups need stage 1, 2 or 3");
  expect_contains(load_error("zero_optimization: {stage: 3, mics_shard_size: -2}"),
                  "zero_optimization.mics_shard_size");
  EXPECT_EQ(load_error("zero_optimization: {stage: 2, mics_shard_size: auto}"), "");
  expect_contains(load_error("zero_optimization: {stage: 2, zero_hpz_partition_size: 2}"),
                  "'zero_optimization.zero_hpz_partition_size' is 2 with "
                  "'zero_optimization.stage' 2; allowed: the secondary copy (ZeRO++ hpZ) is of "
                  "stage 3's parameters");
  expect_contains(
      load_error("zero_optimization: {stage: 3, zero_hpz_partition_size: 2, mics_shard_size: 2}"),
      "with 'zero_optimization.mics_shard_size' 2; allowed: one of the two");
  expect_contains(load_error("zero_optimization: {stage: 3, zero_hpz_partition_size: 2, "
                             "offload_param: {device: cpu}}"),
                  "allowed: zero_hpz_partition_size 1 with parameter offload");
  expect_contains(load_error("zero_optimization: {stage: 3, zero_hpz_partition_size: 0}"),
                  "zero_optimization.zero_hpz_partition_size");
  EXPECT_EQ(load_error("zero_optimization: {stage: 3, zero_hpz_partition_size: 2}"), "");
  EXPECT_EQ(load_error("zero_optimization: {stage: 3, zero_hpz_partition_size: auto, "
                       "mics_shard_size: auto}"),
            "");
  // With stage auto the planner may still choose stage 3, so no contradiction.
  EXPECT_EQ(load_error("zero_optimization: {stage: auto, offload_param: {device: cpu}}"), "");
}

// offload_optimizer.overlap_step: true is refused, naming what rules it out, wherever the
// step inside backward could not be exact or could not run; auto and false never are.
TEST(Config, OverlapStepTrueIsRefusedWhereItCannotBeExact) {
  const std::string oo = "offload_optimizer: {device: cpu, overlap_step: true}";
  expect_contains(load_error("zero_optimization: {stage: 2, offload_optimizer: {overlap_step: "
                             "true}}"),
                  "'zero_optimization.offload_optimizer.overlap_step' is true with "
                  "'zero_optimization.offload_optimizer.device' none; allowed: overlap_step "
                  "steps an offloaded optimizer");
  expect_contains(load_error("zero_optimization: {stage: 1, " + oo + "}"),
                  "is true with 'zero_optimization.stage' 1; allowed: stage 2 or 3");
  expect_contains(load_error("gradient_clipping: 1.0\nzero_optimization: {stage: 3, " + oo + "}"),
                  "is true with 'gradient_clipping' 1; allowed: gradient_clipping 0");
  expect_contains(load_error("fp16: {enabled: true}\nzero_optimization: {stage: 2, " + oo + "}"),
                  "is true with 'fp16.enabled' true; allowed: bf16 or fp32");
  expect_contains(load_error("zero_optimization: {stage: 3, " + oo +
                             ", offload_param: {device: nvme, nvme_path: /tmp}}"),
                  "with 'zero_optimization.offload_param.device' nvme; allowed: parameter "
                  "offload none or cpu");
  expect_contains(load_error("zero_optimization: {stage: 2, offload_optimizer: {device: cpu, "
                             "overlap_step: yes}}"),
                  "zero_optimization.offload_optimizer.overlap_step");
  expect_contains(load_error("gradient_clipping: 1.0\nbf16: {enabled: true}\nzero_optimization: "
                             "{stage: 3, offload_param: {device: cpu}, " +
                             oo + "}"),
                  "is true with 'gradient_clipping' 1; allowed: gradient_clipping 0");
  EXPECT_EQ(load_error("bf16: {enabled: true}\nzero_optimization: {stage: 3, "
                       "offload_param: {device: cpu}, " +
                       oo + "}"),
            "");
  for (const char* v : {"auto", "false"}) {
    EXPECT_EQ(load_error(std::string("gradient_clipping: 1.0\nzero_optimization: {stage: 1, "
                                     "offload_optimizer: {overlap_step: ") +
                         v + "}}"),
              "");
  }
  const Config c = load_config_string("zero_optimization: {stage: 2, " + oo + "}", "t").config;
  EXPECT_EQ(c.zero.offload_optimizer.overlap_step, "true");
  EXPECT_EQ(Config().zero.offload_optimizer.overlap_step, "auto");
}

TEST(Config, AutoIsAcceptedForNumbersAndOffload) {
  const Config c = load_config_string(
                       "zero_optimization:\n  stage: auto\n  reduce_bucket_size: auto\n"
                       "  offload_optimizer: {device: auto}\noptimizer:\n  params: {betas: auto}\n",
                       "t")
                       .config;
  EXPECT_FALSE(c.zero.stage.has_value());
  EXPECT_FALSE(c.zero.reduce_bucket_size.has_value());
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Auto);
  EXPECT_FALSE(c.optimizer.beta1.has_value());
}

TEST(Config, BadYamlNamesTheFile) {
  expect_contains(load_error("zero_optimization: {stage: [1,\n"), "test.yaml: not valid YAML");
  expect_contains(load_error("- 1\n- 2\n"), "must be a mapping");
}

TEST(Config, MissingFileIsAClearError) {
  try {
    load_config_file("/nonexistent/zs.yaml");
    FAIL();
  } catch (const Error& e) {
    expect_contains(e.what(), "'/nonexistent/zs.yaml' cannot be read");
  }
}

TEST(Config, EmittedYamlLoadsBackToTheSameConfig) {
  Config c;
  c.bf16 = true;
  c.zero.stage = 3;
  c.zero.reduce_bucket_size.reset();
  c.zero.offload_optimizer.device = OffloadDevice::Nvme;
  c.zero.offload_optimizer.nvme_path = "/mnt/nvme0";
  c.optimizer.lr = 2.5e-4;
  c.optimizer.beta2 = 0.95;
  c.gradient_clipping = 0.5;
  const std::string text = emit_config_yaml(c);
  const auto loaded = load_config_string(text, "emitted");
  EXPECT_TRUE(loaded.warnings.empty());
  const Config& back = loaded.config;
  EXPECT_TRUE(back.bf16);
  EXPECT_EQ(back.zero.stage, 3);
  EXPECT_FALSE(back.zero.reduce_bucket_size.has_value());
  EXPECT_EQ(back.zero.offload_optimizer.device, OffloadDevice::Nvme);
  EXPECT_EQ(back.zero.offload_optimizer.nvme_path, "/mnt/nvme0");
  EXPECT_DOUBLE_EQ(*back.optimizer.lr, 2.5e-4);
  EXPECT_DOUBLE_EQ(*back.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(*back.gradient_clipping, 0.5);
  EXPECT_EQ(emit_config_yaml(back), text);
}

// communication_data_type is DeepSpeed's: one of its three names, or left unset (null in
// a DeepSpeed JSON file); the emitted YAML writes it only where set.
TEST(Config, CommunicationDataTypeTakesDeepSpeedsNamesOrNull) {
  EXPECT_EQ(Config().communication_data_type, "");
  for (const char* name : {"fp32", "fp16", "bf16"}) {
    const auto loaded = load_config_string(fmt::format("communication_data_type: {}", name), "t");
    EXPECT_EQ(loaded.config.communication_data_type, name);
    EXPECT_TRUE(loaded.warnings.empty());
    expect_contains(emit_config_yaml(loaded.config),
                    fmt::format("communication_data_type: {}", name));
  }
  const auto unset = load_config_string(R"({"communication_data_type": null})", "ds.json");
  EXPECT_EQ(unset.config.communication_data_type, "");
  EXPECT_TRUE(unset.warnings.empty());
  EXPECT_EQ(emit_config_yaml(unset.config).find("communication_data_type"), std::string::npos);
  const std::string msg = load_error("communication_data_type: bfloat16");
  expect_contains(msg, "'communication_data_type'");
  expect_contains(msg, "'bfloat16'");
  expect_contains(msg, "one of fp32, fp16, bf16");
}

// A DeepSpeed feature zeroshard lacks loads while the config leaves it off, with a warning,
// and is refused by name, with what to do instead, when the config turns it on.
TEST(Config, DeepSpeedFeaturesZeroshardLacksLoadWhileOffAndAreRefusedByNameWhenOn) {
  const auto off = load_config_string(R"({
      "amp": {"enabled": false}, "elasticity": {"enabled": false}, "autotuning": {"fast": true},
      "sparse_gradients": false, "data_types": {"grad_accum_dtype": "fp32"},
      "checkpoint": {"tag_validation": "Warn"}, "memory_breakdown": false,
      "zero_optimization": {"stage": 2, "cpu_offload": false, "zero_quantized_weights": false},
      "aio": {"thread_count": 4}})",
                                      "ds.json");
  EXPECT_EQ(off.config.aio.intra_op_parallelism, 4);  // DeepSpeed's older name
  std::string said;
  for (const auto& w : off.warnings) said += w + "\n";
  expect_contains(said, "config key 'amp' is accepted: it leaves off a DeepSpeed feature");
  expect_contains(said, "'aio.thread_count' is read as 'aio.intra_op_parallelism'");
  expect_contains(said, "'checkpoint.tag_validation' is accepted and ignored");
  std::string error = load_error(R"({"amp": {"enabled": true}})");
  expect_contains(error, "config key 'amp' turns on a DeepSpeed feature zeroshard does not have");
  expect_contains(error, "set bf16.enabled or fp16.enabled");
  error = load_error(R"({"zero_optimization": {"cpu_offload": true}})");
  expect_contains(error, "'zero_optimization.cpu_offload' is 'true'");
  expect_contains(error, "zero_optimization.offload_optimizer.device: cpu");
  expect_contains(error, "allowed: false");
  error = load_error(R"({"data_types": {"grad_accum_dtype": "bf16"}})");
  expect_contains(error, "gradients accumulate in fp32");
  error = load_error(R"({"sparse_attention": {"mode": "fixed", "block": 16}})");
  expect_contains(error, "'sparse_attention' turns on a DeepSpeed feature");
  expect_contains(error, "allowed: the section left out");
  EXPECT_EQ(error.find("enabled: false"), std::string::npos) << error;  // it has no such key
  error = load_error(R"({"progressive_layer_drop": {"enabled": true, "theta": 0.5}})");
  expect_contains(error, "layers are not dropped");
  error = load_error(R"({"optimizer": {"type": "OnebitAdam"}})");  // DeepSpeed's old spelling
  expect_contains(error, "1-bit Adam compresses gradients");
}

// DeepSpeed 0.19.8's schema beyond the features above: every key loads at DeepSpeed's
// default (or under its other name) and is refused by name where it asks for more.
TEST(Config, DeepSpeedsWholeSchemaLoadsAtItsDefaultsAndRefusesByNameWhatZeroshardLacks) {
  const auto loaded = load_config_string(R"({
      "managed_gradient_accumulation": true, "data_parallel_size": 2,
      "sequence_parallel_size": 1, "bfloat16": {"enabled": true}, "log_level": "info",
      "expert_parallel": {"enabled": false, "autoep_size": 4, "use_grouped_mm": false},
      "compile": {"deepcompile": false, "offload_activation": false},
      "timers": {"throughput": {"enabled": true}}, "checkpoint": {"checkpoint_serialization": true},
      "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000, "compute_grad_norm": true,
                            "max_live_parameters": 2000}})",
                                         "ds.json");
  EXPECT_EQ(loaded.config.data_parallel_size, 2);
  EXPECT_TRUE(loaded.config.bf16);  // bfloat16: DeepSpeed's other name of bf16
  EXPECT_EQ(loaded.config.zero.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(loaded.config.zero.stage3_max_live_parameters, 2000);
  std::string said;
  for (const auto& w : loaded.warnings) said += w + "\n";
  expect_contains(said,
                  "'zero_optimization.prefetch_bucket_size' is read as "
                  "'zero_optimization.stage3_prefetch_bucket_size'");
  expect_contains(said, "config key 'log_level' is accepted and ignored");
  // AutoEP's section is read (the Python package applies it where enabled).
  EXPECT_FALSE(loaded.config.autoep.enabled);
  EXPECT_EQ(loaded.config.autoep.autoep_size, 4);
  EXPECT_FALSE(loaded.config.autoep.use_grouped_mm);
  EXPECT_TRUE(Config{}.autoep.use_grouped_mm);  // DeepSpeed's default
  for (const auto& [config, said_back] : std::vector<std::pair<const char*, const char*>>{
           {R"({"compile": {"deepcompile": true}})", "DeepCompile is not supported"},
           {R"({"zero_optimization": {"zenflow": {}}})", "ZenFlow is not supported"},
           {R"({"gradient_allreduce_op": "sum"})", "allowed: mean"},
           {R"({"bf16": {"bf16_optimizer_states": true}})", "optimizer states are fp32"}}) {
    const std::string error = load_error(config);
    expect_contains(error, "a DeepSpeed feature zeroshard does not have");
    expect_contains(error, said_back);
  }
}

// offload_optimizer.ratio (DeepSpeed's ZeRO-Offload++): the share of the optimizer stepped
// on the host, below 1 only where the rest can step on the GPU.
TEST(Config, OffloadRatioBelowOneOnlyAtStage3WithCpuAdamAndParametersOnTheDevice) {
  const std::string base = R"({"zero_optimization": {"stage": 3, "offload_optimizer": )";
  for (const char* all : {"1", "1.0"}) {  // DeepSpeed's default, written either way
    const auto loaded = load_config_string(
        fmt::format(R"({{"zero_optimization": {{"offload_optimizer": {{"ratio": {}}}}}}})", all),
        "ds.json");
    EXPECT_TRUE(loaded.warnings.empty());
    EXPECT_EQ(loaded.config.zero.offload_optimizer.ratio, 1.0);
  }
  const auto split = load_config_string(base + R"({"device": "cpu", "ratio": 0.3}}})", "ds.json");
  EXPECT_EQ(split.config.zero.offload_optimizer.ratio, 0.3);
  expect_contains(emit_config_yaml(split.config), "ratio: 0.3");
  const auto left = load_config_string(base + R"({"device": "cpu", "ratio": "auto"}}})", "ds.json");
  EXPECT_FALSE(left.config.zero.offload_optimizer.ratio.has_value());
  // Refused, naming the key and the value and what allows it.
  std::string error = load_error(R"({"zero_optimization": {"offload_optimizer": {"ratio": 0.3}}})");
  expect_contains(error,
                  "'zero_optimization.offload_optimizer.ratio' is 0.3 with "
                  "'zero_optimization.offload_optimizer.device' 'none'");
  expect_contains(error, "allowed: device cpu");
  error = load_error(base + R"({"device": "nvme", "nvme_path": "/x", "ratio": 0.3}}})");
  expect_contains(error, "'zero_optimization.offload_optimizer.device' 'nvme'");
  error = load_error(
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})");
  expect_contains(error, "is 0.5 with 'zero_optimization.stage' 2; allowed: stage 3");
  error =
      load_error(base + R"({"device": "cpu", "ratio": 0.3}, "offload_param": {"device": "cpu"}}})");
  expect_contains(error,
                  "'zero_optimization.offload_param.device' 'cpu'; allowed: "
                  "offload_param.device none");
  error = load_error(R"({"optimizer": {"type": "Lamb"}, )" + base.substr(1) +
                     R"({"device": "cpu", "ratio": 0.3}}})");
  expect_contains(error, "with optimizer Lamb; allowed: optimizer Adam or AdamW");
  error = load_error(base + R"({"device": "cpu", "ratio": 0.3, "overlap_step": true}}})");
  expect_contains(error,
                  "overlap_step' is true with 'zero_optimization.offload_optimizer.ratio' 0.3");
  error = load_error(base + R"({"device": "cpu", "ratio": 1.5}}})");
  expect_contains(error, "'zero_optimization.offload_optimizer.ratio'");
  expect_contains(error, "1.5");
}

// DeepSpeed's Adam parameters: its type Adam means AdamW's decoupled weight decay unless
// adam_w_mode is false (deepspeed/runtime/engine.py); torch_adam changes no arithmetic;
// bias_correction false is read for them (and Lamb), refused for a torch.optim class.

TEST(Config, AutoThatOnlyTheTrainerFillsSaysSoOutsideIt) {
  const std::string error = load_error(R"({"bf16": {"enabled": "auto"}})");
  expect_contains(error, "config key 'bf16.enabled' is 'auto'");
  expect_contains(error, "the Hugging Face Trainer fills");
  expect_contains(error, "allowed: true or false");
  // Where the planner fills 'auto' it stays accepted.
  EXPECT_FALSE(load_config_string(R"({"train_micro_batch_size_per_gpu": "auto"})", "ds.json")
                   .config.train_micro_batch_size_per_gpu);
}

TEST(Config, DeepSpeedsAdamParametersAreReadAsDeepSpeedReadsThem) {
  const auto adam = load_config_string(
      R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": true}}})", "ds.json");
  EXPECT_TRUE(adam.config.optimizer.adam_w_mode);
  EXPECT_TRUE(adam.config.optimizer.torch_adam);
  const auto l2 = load_config_string(
      R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})", "ds.json");
  EXPECT_FALSE(l2.config.optimizer.adam_w_mode);
  EXPECT_FALSE(
      load_config_string(R"({"optimizer": {"type": "Adam", "params": {"bias_correction": false}}})",
                         "ds.json")
          .config.optimizer.bias_correction);
  const std::string error =
      load_error(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "x": 1})");
  expect_contains(error, "'x' is not known");
}

TEST(Config, ATorchOptimizerTypeKeepsItsParamsForTheClassAndCountsItsState) {
  const auto sgd = load_config_string(R"({"optimizer": {"params": {"lr": 0.1, "momentum": 0.9,
      "nesterov": true}, "type": "SGD"}})",
                                      "ds.json");
  const OptimizerConfig& o = sgd.config.optimizer;
  EXPECT_TRUE(o.external);
  EXPECT_EQ(o.type, "SGD");
  EXPECT_EQ(o.torch_params.at("momentum"), "0.9");
  EXPECT_EQ(o.torch_params.at("nesterov"), "true");
  EXPECT_EQ(o.state_bytes, 4);  // the momentum buffer: a third of Adam's m, v and master
  const auto plain =
      load_config_string(R"({"optimizer": {"type": "SGD", "params": {"lr": 1}}})", "ds.json");
  EXPECT_EQ(plain.config.optimizer.state_bytes, 0);
  const auto rms = load_config_string(
      R"({"optimizer": {"type": "RMSprop", "params": {"momentum": 0.5, "centered": true}}})",
      "ds.json");
  EXPECT_EQ(rms.config.optimizer.state_bytes, 12);
  EXPECT_EQ(load_config_string("{}", "x").config.optimizer.state_bytes, 8);  // Adam's m and v
  // The emitted config names the class and its params, and loads back to them.
  const auto again = load_config_string(emit_config_yaml(sgd.config), "emitted");
  EXPECT_EQ(again.config.optimizer.torch_params, o.torch_params);
  EXPECT_TRUE(again.config.optimizer.external);
}

TEST(Config, OptimizerTypesZeroshardLacksAreRefusedWithTheReason) {
  std::string error =
      load_error(R"({"optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-3}}})");
  expect_contains(error, "config key 'optimizer.type' is 'OneBitLamb'");
  expect_contains(error, "compresses gradients");
  expect_contains(error, "allowed: one of AdamW, Adam, Lamb, SGD, Adagrad");
  error = load_error(R"({"optimizer": {"type": "OneBitAdam"}})");
  expect_contains(error, "reduces them in full precision: use Adam");
  // An elementwise class pages its state through NVMe; one that is not (the Python
  // package says so of transformers' Adafactor) is refused there.
  auto adagrad = load_config_string(R"({"optimizer": {"type": "Adagrad"}, "zero_optimization":
      {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})",
                                    "ds.json");
  EXPECT_TRUE(adagrad.config.optimizer.elementwise);
  adagrad.config.optimizer.type = "Adafactor";
  adagrad.config.optimizer.elementwise = false;
  try {
    check_contradictions(adagrad.config);
    ADD_FAILURE() << "Adafactor's state was put on NVMe";
  } catch (const Error& e) {
    expect_contains(e.what(),
                    "'nvme' with optimizer Adafactor, whose update needs every group's "
                    "whole parameters in one step; allowed: cpu or none");
  }
  error = load_error(R"({"optimizer": {"type": "SGD", "parameters": {}}})");
  expect_contains(error, "'optimizer.parameters' is not known");
  error = load_error(R"({"optimizer": {"type": "SGD"}, "zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "overlap_step": true}}})");
  expect_contains(error, "torch.optim.SGD steps after backward");
}

TEST(Config, DeepSpeedsLambTakesItsOwnParamsAndNoOtherTypeDoes) {
  const auto lamb = load_config_string(R"({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3,
      "weight_decay": 0.01, "bias_correction": false, "max_coeff": 0.3, "min_coeff": 0.01}}})",
                                       "ds.json");
  EXPECT_EQ(lamb.config.optimizer.type, "Lamb");
  EXPECT_FALSE(lamb.config.optimizer.external);
  EXPECT_EQ(*lamb.config.optimizer.max_coeff, 0.3);
  EXPECT_FALSE(lamb.config.optimizer.bias_correction);
  std::string error = load_error(R"({"optimizer": {"type": "AdamW", "params": {"max_coeff": 1}}})");
  expect_contains(error, "are Lamb's, but 'optimizer.type' is AdamW");
  error = load_error(R"({"optimizer": {"type": "Lamb", "params": {"max_grad_norm": 1.0}}})");
  expect_contains(error, "'optimizer.params.max_grad_norm' is 1; allowed: 0");
  expect_contains(error, "gradient_clipping");
  error = load_error(R"({"optimizer": {"type": "Lamb", "params": {"max_coeff": 0.01,
      "min_coeff": 0.1}}})");
  expect_contains(error, "allowed: max_coeff >= min_coeff");
  error = load_error(R"({"optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "overlap_step": true}}})");
  expect_contains(error, "Lamb's trust ratio needs the norm of every parameter's update");
}
