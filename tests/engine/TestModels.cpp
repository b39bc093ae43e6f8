#include "tests/engine/TestModels.h"

#include <fmt/format.h>

#include <torch/torch.h>

#include "common/Error.h"

namespace zeroshard::testing {
namespace {

// A fixed global micro-batch per (step, micro), independent of who asks.
torch::Generator data_generator(int step, int micro) {
  auto gen = at::detail::createCPUGenerator(1000 + 17 * step + micro);
  return gen;
}

class Mlp : public TestModel {
 public:
  Mlp(const Scenario& s, int batch) : s_(s), batch_(batch) {
    const int64_t in = 16 * s.scale, hidden = 32 * s.scale, out = 8 * s.scale;
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    extra = register_module("extra", torch::nn::Linear(hidden, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
    if (s.frozen) fc1->bias.set_requires_grad(false);
    if (s.counter) {
      const char* rank = std::getenv("RANK");
      seen = register_buffer("seen", at::full({1}, 100.0 * (rank ? std::atoi(rank) : 0)));
    }
  }

  at::Tensor loss(int step, int micro, int64_t begin, int64_t end) override {
    auto gen = data_generator(step, micro);
    const at::Tensor x =
        at::randn({batch_, 16 * s_.scale}, gen).slice(0, begin, end).to(fc1->weight.device());
    const at::Tensor y =
        at::randn({batch_, 8 * s_.scale}, gen).slice(0, begin, end).to(fc1->weight.device());
    if (seen.defined()) seen.add_(x.mean().to(at::kFloat));
    at::Tensor h = run_unit(*fc1, [&] { return fc1->forward(x.to(fc1->weight.scalar_type())); });
    h = torch::tanh(h);
    bool use_extra = !s_.unused || step % 2 == 0;
    if (s_.branch) use_extra = x[0][0].item<double>() > 0;  // differs between ranks
    if (use_extra) h = torch::tanh(run_unit(*extra, [&] { return extra->forward(h); }));
    const at::Tensor out = run_unit(*fc2, [&] { return fc2->forward(h); }).to(at::kFloat);
    return torch::mse_loss(out, y);
  }

  std::vector<std::shared_ptr<torch::nn::Module>> units() override {
    return {fc1.ptr(), extra.ptr(), fc2.ptr()};
  }

 private:
  Scenario s_;
  int64_t batch_;
  torch::nn::Linear fc1{nullptr}, extra{nullptr}, fc2{nullptr};
  at::Tensor seen;
};

constexpr int64_t kVocab = 32, kDim = 16, kSeq = 8, kHeads = 2;

// Pre-norm causal self-attention.
class AttentionBlock : public torch::nn::Module {
 public:
  AttentionBlock() {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    q = register_module("q", torch::nn::Linear(kDim, kDim));
    // No key bias: its true gradient is exactly 0 (softmax ignores a per-row shift),
    // so AdamW would only amplify rounding noise against eps.
    k = register_module("k", torch::nn::Linear(torch::nn::LinearOptions(kDim, kDim).bias(false)));
    v = register_module("v", torch::nn::Linear(kDim, kDim));
    o = register_module("o", torch::nn::Linear(kDim, kDim));
  }

  at::Tensor forward(const at::Tensor& input) {
    const at::Tensor x = ln->forward(input);
    const int64_t b = x.size(0), hd = kDim / kHeads;
    auto split = [&](const at::Tensor& t) { return t.view({b, kSeq, kHeads, hd}).transpose(1, 2); };
    const at::Tensor qh = split(q->forward(x)), kh = split(k->forward(x)),
                     vh = split(v->forward(x));
    at::Tensor scores = qh.matmul(kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    const at::Tensor mask = torch::ones({kSeq, kSeq}, x.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(mask, -1e4).softmax(-1);
    return o->forward(scores.matmul(vh).transpose(1, 2).reshape({b, kSeq, kDim}));
  }

  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
};

class MlpBlock : public torch::nn::Module {
 public:
  MlpBlock() {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    fc1 = register_module("fc1", torch::nn::Linear(kDim, 2 * kDim));
    fc2 = register_module("fc2", torch::nn::Linear(2 * kDim, kDim));
  }

  at::Tensor forward(const at::Tensor& x) {
    return fc2->forward(torch::gelu(fc1->forward(ln->forward(x))));
  }

  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Embedding, an attention block and an MLP block with residuals, and an output head
// tied to the embedding: at stage 3 the embedding is a unit of its own (left over), read
// twice, so both reads go through run_unit.
class TinyTransformer : public TestModel {
 public:
  TinyTransformer(const Scenario& s, int batch) : s_(s), batch_(batch) {
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    attn = register_module("attn", std::make_shared<AttentionBlock>());
    mlp = register_module("mlp", std::make_shared<MlpBlock>());
    // Frozen: the MLP's LayerNorm, at the start of its unit. Its weight is read for the
    // input's gradient after every trainable gradient of the unit is in (UnitRelease.h).
    if (s.frozen) {
      mlp->ln->weight.set_requires_grad(false);
      mlp->ln->bias.set_requires_grad(false);
    }
  }

  at::Tensor loss(int step, int micro, int64_t begin, int64_t end) override {
    auto gen = data_generator(step, micro);
    const at::Tensor tokens =
        at::randint(kVocab, {batch_, kSeq + 1}, gen).slice(0, begin, end).to(emb->weight.device());
    const at::Tensor input = tokens.slice(1, 0, kSeq);
    const at::Tensor target = tokens.slice(1, 1, kSeq + 1);
    at::Tensor h = run_unit(*emb, [&] { return emb->forward(input); });
    h = h + run_unit(*attn, [&] { return attn->forward(h); });
    if (!s_.unused || step % 2 == 0) h = h + run_unit(*mlp, [&] { return mlp->forward(h); });
    const at::Tensor logits =
        run_unit(*emb, [&] { return h.matmul(emb->weight.t()); }).to(at::kFloat);  // tied head
    return torch::cross_entropy_loss(logits.reshape({-1, kVocab}), target.reshape({-1}));
  }

  std::vector<std::shared_ptr<torch::nn::Module>> units() override { return {attn, mlp}; }

 private:
  Scenario s_;
  int64_t batch_;
  torch::nn::Embedding emb{nullptr};
  std::shared_ptr<AttentionBlock> attn;
  std::shared_ptr<MlpBlock> mlp;
};

// Elementwise only, so every precision runs the same arithmetic on the CPU: y = x * w + b.
class Elementwise : public TestModel {
 public:
  explicit Elementwise(int batch) : batch_(batch) {
    w = register_parameter("w", torch::randn({64}));
    b = register_parameter("b", torch::randn({64}));
  }

  at::Tensor loss(int step, int micro, int64_t begin, int64_t end) override {
    auto gen = data_generator(step, micro);
    const at::Tensor x = at::randn({batch_, 64}, gen).slice(0, begin, end).to(w.device());
    const at::Tensor y = at::randn({batch_, 64}, gen).slice(0, begin, end).to(w.device());
    // w and b are the model's own parameters: at stage 3 the model itself is their unit.
    const at::Tensor out = run_unit(*this, [&] { return x.to(w.scalar_type()) * w + b; });
    return torch::mse_loss(out.to(at::kFloat), y);
  }

  std::vector<std::shared_ptr<torch::nn::Module>> units() override { return {}; }

 private:
  int64_t batch_;
  at::Tensor w, b;
};

}  // namespace

Scenario Scenario::parse(const std::vector<std::string>& args) {
  Scenario s;
  for (const auto& a : args) {
    const auto eq = a.find('=');
    const std::string key = a.substr(0, eq), value = a.substr(eq + 1);
    if (key == "model")
      s.model = value;
    else if (key == "stage")
      s.stage = std::stoi(value);
    else if (key == "steps")
      s.steps = std::stoi(value);
    else if (key == "accum")
      s.accum = std::stoi(value);
    else if (key == "clip")
      s.clip = std::stod(value);
    else if (key == "dtype")
      s.dtype = value;
    else if (key == "batch")
      s.batch = std::stoi(value);
    else if (key == "bucket")
      s.bucket = std::stoll(value);
    else if (key == "frozen")
      s.frozen = value == "1";
    else if (key == "unused")
      s.unused = value == "1";
    else if (key == "die_at")
      s.die_at = std::stoi(value);
    else if (key == "timeout")
      s.timeout = std::stod(value);
    else if (key == "scale")
      s.scale = std::stoi(value);
    else if (key == "prefetch")
      s.prefetch = std::stoll(value);
    else if (key == "live")
      s.live = std::stoll(value);
    else if (key == "persist")
      s.persist = std::stoll(value);
    else if (key == "branch")
      s.branch = value == "1";
    else if (key == "overlap")
      s.overlap = value == "1";
    else if (key == "overflow_at")
      s.overflow_at = std::stoi(value);
    else if (key == "lr")
      s.lr = std::stod(value);
    else if (key == "offload_opt")
      s.offload_opt = value;
    else if (key == "offload_param")
      s.offload_param = value;
    else if (key == "nvme_path")
      s.nvme_path = value;
    else if (key == "sub_group")
      s.sub_group = std::stoll(value);
    else if (key == "max_in_cpu")
      s.max_in_cpu = std::stoll(value);
    else if (key == "buffers")
      s.buffers = std::stoi(value);
    else if (key == "mics")
      s.mics = std::stoi(value);
    else if (key == "hpz")
      s.hpz = std::stoi(value);
    else if (key == "device")
      s.device = value;
    else if (key == "overlap_step")
      s.overlap_step = value;
    else if (key == "ratio")
      s.ratio = std::stod(value);
    else if (key == "counter")
      s.counter = value == "1";
    else if (key == "broadcast_buffers")
      s.broadcast_buffers = value == "1";
    else
      fail("unknown scenario key '{}'", key);
  }
  return s;
}

std::vector<std::string> Scenario::to_args() const {
  return {"model=" + model,
          "stage=" + std::to_string(stage),
          "steps=" + std::to_string(steps),
          "accum=" + std::to_string(accum),
          "clip=" + std::to_string(clip),
          "dtype=" + dtype,
          "batch=" + std::to_string(batch),
          "bucket=" + std::to_string(bucket),
          std::string("frozen=") + (frozen ? "1" : "0"),
          std::string("unused=") + (unused ? "1" : "0"),
          std::string("overlap=") + (overlap ? "1" : "0"),
          std::string("branch=") + (branch ? "1" : "0"),
          "scale=" + std::to_string(scale),
          "prefetch=" + std::to_string(prefetch),
          "live=" + std::to_string(live),
          "persist=" + std::to_string(persist),
          "die_at=" + std::to_string(die_at),
          "timeout=" + std::to_string(timeout),
          "overflow_at=" + std::to_string(overflow_at),
          "lr=" + std::to_string(lr),
          "offload_opt=" + offload_opt,
          "offload_param=" + offload_param,
          "nvme_path=" + nvme_path,
          "sub_group=" + std::to_string(sub_group),
          "max_in_cpu=" + std::to_string(max_in_cpu),
          "buffers=" + std::to_string(buffers),
          "mics=" + std::to_string(mics),
          "hpz=" + std::to_string(hpz),
          "device=" + device,
          "overlap_step=" + overlap_step,
          "ratio=" + fmt::format("{}", ratio),
          std::string("counter=") + (counter ? "1" : "0"),
          std::string("broadcast_buffers=") + (broadcast_buffers ? "1" : "0")};
}

Config Scenario::config() const {
  Config c;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = bucket;
  c.zero.allgather_bucket_size = bucket;
  c.gradient_accumulation_steps = accum;
  c.zero.overlap_comm = overlap;
  c.comm_timeout_seconds = timeout;
  if (prefetch >= 0) c.zero.stage3_prefetch_bucket_size = prefetch;
  if (live >= 0) c.zero.stage3_max_live_parameters = live;
  if (persist >= 0) c.zero.stage3_param_persistence_threshold = persist;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_clipping = clip;
  c.bf16 = dtype == "bf16";
  c.fp16.enabled = dtype == "fp16";
  c.fp16.hysteresis = 1;
  c.fp16.initial_scale_power = 8;
  c.optimizer.lr = lr;
  c.optimizer.weight_decay = weight_decay;
  auto device = [](const std::string& d) {
    return d == "cpu"    ? OffloadDevice::Cpu
           : d == "nvme" ? OffloadDevice::Nvme
                         : OffloadDevice::None;
  };
  auto& oo = c.zero.offload_optimizer;
  auto& op = c.zero.offload_param;
  oo.device = device(offload_opt);
  op.device = device(offload_param);
  oo.nvme_path = op.nvme_path = nvme_path;
  oo.buffer_count = op.buffer_count = buffers;
  oo.overlap_step = overlap_step;
  if (ratio >= 0) {
    oo.ratio = ratio;
  } else {
    oo.ratio.reset();
  }
  c.zero.mics_shard_size = mics;
  c.zero.hpz_partition_size = hpz;
  c.broadcast_buffers = broadcast_buffers;
  if (sub_group > 0) c.zero.sub_group_size = sub_group;
  if (max_in_cpu >= 0) op.max_in_cpu = max_in_cpu;
  return c;
}

namespace {

std::shared_ptr<TestModel> make_on_cpu(const Scenario& s) {
  if (s.model == "mlp") return std::make_shared<Mlp>(s, s.batch);
  if (s.model == "transformer") return std::make_shared<TinyTransformer>(s, s.batch);
  if (s.model == "elementwise") return std::make_shared<Elementwise>(s.batch);
  fail("unknown model '{}'", s.model);
}

}  // namespace

// Built on the CPU from one seed, then moved: the same initial values on every device.
std::shared_ptr<TestModel> make_model(const Scenario& s) {
  torch::manual_seed(42);
  auto model = make_on_cpu(s);
  if (s.device != "cpu") model->to(torch::Device(s.device));
  return model;
}

}  // namespace zeroshard::testing
