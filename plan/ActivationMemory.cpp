// The activations term of the memory model (M_a): what a forward keeps for backward per
// block and for the head, under the engine's policies and offload, and the KV cache served
// (docs/memory-model.md); declared in plan/MemoryModel.h.
#include <algorithm>

#include "plan/MemoryModel.h"

namespace zeroshard {

namespace {

// One head's width, and the keys' (or values') width of a token: kv heads x head width.
int64_t head_width(const ModelSpec& spec) {
  return spec.head_dim > 0 ? spec.head_dim : spec.hidden / spec.heads;
}

int64_t kv_width(const ModelSpec& spec) {
  return (spec.kv_heads > 0 ? spec.kv_heads : spec.heads) * head_width(spec);
}

// Bytes one token's pass through a norm keeps for backward: its input (an fp32 copy where
// the norm computes in fp32) and its normalised output, which the next linear keeps too.
int64_t norm_bytes(const ModelSpec& spec, int64_t kl) {
  return spec.hidden * (spec.norm_fp32_input ? 4 + 2 * kl : 2 * kl);
}

int64_t intermediate_width(const ModelSpec& spec) {
  return spec.intermediate > 0 ? spec.intermediate : 4 * spec.hidden;
}

// A dense MLP run by TiledMLP keeps its input alone (the norm's output, counted with the
// norm): per token, what a block keeps less; and what one tile holds while backward computes
// it again.
bool tiles_mlp(const ModelSpec& spec, const TrainingShape& t) {
  return t.mlp_tiles > 0 && spec.experts_per_token == 0;
}
int64_t mlp_kept_bytes(const ModelSpec& spec, int64_t kl) {
  return spec.mlp_tensors * kl * intermediate_width(spec);
}
int64_t tile_tokens(int64_t tokens, int64_t tiles) {
  return (tokens + tiles - 1) / tiles;
}

// One block, per token, at sequence length s (docs/memory-model.md "Activations").
int64_t block_bytes(const ModelSpec& spec, int64_t s, int64_t kl) {
  const int64_t h = spec.hidden, a = spec.heads;
  const int64_t head_dim = head_width(spec);
  const int64_t kv = kv_width(spec);
  const int64_t inner = intermediate_width(spec);
  // A fused kernel keeps queries, keys, values, its output (the output projection's input)
  // and an fp32 log-sum-exp per head. Eager attention repeats keys and values to every
  // head, copies the output for the projection, and keeps its fp32 softmax and the
  // compute-precision copy the values multiply.
  int64_t attention = spec.attention_scores ? kl * 4 * a * head_dim + (kl + 4) * a * s
                                            : kl * (2 * a * head_dim + 2 * kv) + 4 * a;
  if (spec.cache_copies_kv) attention += kl * 2 * kv;
  int64_t mlp = spec.mlp_tensors * kl * inner;
  // Routed: each token's MLP runs in k experts, on a gathered copy of its input, and
  // each expert's output is kept for its routing weight.
  if (spec.experts_per_token > 0) mlp = spec.experts_per_token * (mlp + 2 * kl * h);
  return spec.norms_per_block * norm_bytes(spec, kl) + attention + mlp;
}

// What splitting the sequence adds to a block, per token of a rank's slice, over `sp`
// ranks. Ulysses: attention runs on the exchanged queries, keys and values and the output
// is exchanged back, so the output projection keeps its input besides the kernel's output
// (one more a x head_dim), and keys and values fewer than the ranks are repeated to one
// head per rank before the exchange (2 x (sp - kv heads) x head_dim more than the block's
// own). torch's ring attention (`ring`): the partial outputs merged into one more a x
// head_dim, on every rank but the ring's last (measured: tests/python/
// test_activation_memory.py); nothing repeated.
int64_t split_sequence_bytes(const ModelSpec& spec, int64_t sp, bool ring, int64_t kl) {
  if (sp <= 1) return 0;
  const int64_t head_dim = head_width(spec);
  const int64_t kv_heads = spec.kv_heads > 0 ? spec.kv_heads : spec.heads;
  const int64_t repeated = ring ? 0 : 2 * std::max<int64_t>(0, sp - kv_heads) * head_dim;
  return kl * (spec.heads * head_dim + repeated);
}

// What a block under the "op" policy keeps per token: its input and the outputs of its
// matmuls and attention kernel (torch's selective checkpoint saves them; the norms,
// rotations, activations and products between are recomputed): queries, keys and values,
// the kernel's output and fp32 log-sum-exp per head (eager attention: its scores and their
// product with the values), the output projection, the MLP's matmuls onto the
// intermediate width and back (in each of k experts, beside the router's logits).
int64_t saved_ops_bytes(const ModelSpec& spec, int64_t s, int64_t kl) {
  const int64_t h = spec.hidden, a = spec.heads, head_dim = head_width(spec);
  const int64_t inner = intermediate_width(spec);
  const int64_t attention =
      spec.attention_scores ? kl * (a * s + a * head_dim) : kl * a * head_dim + 4 * a;
  int64_t mlp = kl * (spec.mlp_matmuls * inner + h);
  if (spec.experts_per_token > 0) mlp = spec.experts_per_token * mlp + kl * spec.experts;
  return kl * (2 * h + a * head_dim + 2 * kv_width(spec)) + attention + mlp;
}

}  // namespace

int64_t kv_cache_bytes(const ModelSpec& spec, const TrainingShape& t, int kl) {
  if (!spec.has_shape()) return 0;
  return 2 * spec.layers * t.micro_batch * t.seq * kv_width(spec) * kl;
}

namespace {

// The blocks' saved activations, per micro-batch: `kept` in all, `largest` in one block.
struct KeptBlocks {
  int64_t kept = 0;
  int64_t largest = 0;
  int64_t recomputed = 0;  // one block's, while backward recomputes it
};

KeptBlocks kept_blocks(const ModelSpec& spec, const TrainingShape& t, int kl) {
  const int64_t sp = std::max<int64_t>(1, t.sequence_parallel);
  const int64_t s = t.seq / sp, b = t.micro_batch, L = spec.layers;
  // TiledMLP's blocks keep no MLP intermediates (under the op policy neither its matmuls'
  // outputs: they run inside the tiles, without gradients), per token.
  const bool tiled = tiles_mlp(spec, t);
  const int64_t tiling_saves = tiled ? mlp_kept_bytes(spec, kl) : 0;
  const int64_t tiling_saves_ops =
      tiled ? kl * (spec.mlp_matmuls * intermediate_width(spec) + spec.hidden) : 0;
  const int64_t per_layer = s * b *
                            (block_bytes(spec, t.seq, kl) +
                             split_sequence_bytes(spec, sp, t.ring_attention, kl) - tiling_saves);
  // Checkpointed: a block recomputed whole keeps only its input, one under the "op" policy
  // its saved ops' outputs; backward recomputes one block at a time.
  const int64_t whole = t.activation_checkpointing ? L : std::min(L, t.recomputed.whole);
  const int64_t ops = std::min(L - whole, t.recomputed.ops);
  const int64_t input = s * b * spec.hidden * kl,
                saved_ops = s * b * (saved_ops_bytes(spec, t.seq, kl) - tiling_saves_ops);
  KeptBlocks k;
  k.kept = (L - whole - ops) * per_layer + whole * input + ops * saved_ops;
  k.largest = L > whole + ops ? per_layer : ops > 0 ? saved_ops : input;
  k.recomputed = whole + ops > 0 ? per_layer : 0;
  // Backward computes one MLP tile again: its intermediates, live beside the recomputed
  // block.
  if (tiled) k.recomputed += tile_tokens(s * b, t.mlp_tiles) * mlp_kept_bytes(spec, kl);
  return k;
}

bool offloads(const TrainingShape& t) {
  return t.activation_offload != Tier::Device && !t.inference && t.part_steps.empty() &&
         t.pipeline_micro_batches == 0;
}

}  // namespace

int64_t offloaded_activation_bytes(const ModelSpec& spec, const TrainingShape& t, int kl) {
  if (!spec.has_shape() || !offloads(t)) return 0;
  return kept_blocks(spec, t, kl).kept;
}

int64_t offload_staging_bytes(const ModelSpec& spec, const TrainingShape& t, int kl) {
  if (!spec.has_shape() || !offloads(t) || t.activation_offload != Tier::Nvme) return 0;
  return 2 * kept_blocks(spec, t, kl).largest;
}

int64_t activation_bytes(const ModelSpec& spec, const TrainingShape& t, int kl) {
  if (!spec.has_shape()) return 0;
  // s: the tokens this rank holds of each sequence; attention still spans t.seq.
  const int64_t sp = std::max<int64_t>(1, t.sequence_parallel);
  const int64_t s = t.seq / sp, b = t.micro_batch, L = spec.layers;
  // Served: nothing is kept for backward. The KV cache, and while the prompt runs one
  // block's temporaries (at most what it would keep for backward) and the last position's
  // logits (generate computes no others), in the compute dtype and in fp32. A KV cache in
  // host RAM leaves three layers' on the device: the running layer's, its copy grown by the
  // new token, and the next layer's, fetched ahead.
  if (t.inference) {
    const int64_t kv = kv_cache_bytes(spec, t, kl);
    return (t.kv_cache_on_host ? kv / L * std::min<int64_t>(3, L) : kv) +
           s * b * block_bytes(spec, s, kl) + (spec.has_head ? b * spec.vocab * (kl + 4) : 0);
  }
  // The final norm, then the logits in compute precision (the model's output) and the
  // fp32 log-probabilities the loss keeps. TiledFusedLogitsLoss keeps neither: the
  // gradients it computed in forward wait for backward (its input's, in place of the norm's
  // output, and the head weight's, whole), and one tile's logits and log-probabilities are
  // live at a time.
  int64_t head = spec.has_head ? s * b * (norm_bytes(spec, kl) + spec.vocab * (kl + 4)) : 0;
  if (spec.has_head && t.logits_tiles > 0)
    head = s * b * norm_bytes(spec, kl) + spec.vocab * spec.hidden * kl +
           tile_tokens(s * b, t.logits_tiles) * spec.vocab * (kl + 4);
  // A pipeline stage holds several micro-batches' (TrainingShape::in_flight), and outputs
  // no op of its own saves: the schedule keeps each in-flight micro-batch's output (the
  // hidden states sent on) for its backward, and on the last stage every micro-batch's
  // logits until step() returns them (those in flight are in `head` already).
  const int64_t held = std::max<int64_t>(1, t.in_flight);
  int64_t outputs = 0;
  if (t.pipeline_micro_batches > 0) {
    outputs = spec.has_head ? (t.pipeline_micro_batches - held) * s * b * spec.vocab * kl
                            : held * s * b * spec.hidden * kl;
  }
  const KeptBlocks blocks = kept_blocks(spec, t, kl);
  const int64_t kept_layers = blocks.kept, recomputed = blocks.recomputed;
  // Offloaded: two blocks' on the device at most, the one whose backward runs (or whose
  // copies out are still in flight in forward) and the one fetched ahead of it.
  if (offloads(t)) return head + recomputed + 2 * blocks.largest;
  if (!t.part_steps.empty()) {
    // Several stages on the rank: a micro-batch in flight on one holds its blocks' (and its
    // output, or the head's); the head's stage keeps the logits of every micro-batch it
    // ran until step() returns them. The peak is the step that holds the most.
    int64_t peak = 0;
    for (const PartsStep& step : t.part_steps) {
      int64_t bytes = 0;
      for (size_t p = 0; p < t.part_layers.size(); ++p) {
        const bool ends_in_head = static_cast<int64_t>(p) == t.head_part;
        const int64_t each = kept_layers / std::max<int64_t>(1, L) * t.part_layers[p] +
                             (ends_in_head ? head : s * b * spec.hidden * kl);
        bytes += step.held[p] * each;
        if (ends_in_head) bytes += (step.forwarded[p] - step.held[p]) * s * b * spec.vocab * kl;
      }
      peak = std::max(peak, bytes);
    }
    return peak + recomputed;
  }
  return held * (kept_layers + head) + recomputed + outputs;
}

Recomputed recomputed_layers(const ModelSpec& spec, const Config& config,
                             const TrainingShape& shape) {
  const std::string& mode = config.activation_checkpointing_mode;
  const int64_t layers = spec.layers;
  Recomputed r;
  if (shape.inference || mode == "none") return r;
  // auto: the planner's choice for this batch and budget (plan/Planner.h fewest_recomputed),
  // carried in the shape.
  if (mode == "auto") return shape.recomputed;
  if (mode == "full") {
    r.whole = layers;
  } else if (mode == "selective") {
    const std::string& option = config.selective_ac_option;
    if (option.empty() || option == "op") {
      r.ops = layers;
    } else {
      r.whole = layers / std::stoll(option);  // blocks N, 2N, ...
    }
  } else if (mode == "memory_budget") {
    const int kl = static_cast<int>(config.compute_bytes());
    TrainingShape t = shape;
    t.recomputed = {};
    const double budget = config.activation_memory_budget.value_or(0.5) *
                          static_cast<double>(activation_bytes(spec, t, kl));
    for (r.whole = 0; r.whole < layers; ++r.whole) {
      t.recomputed.whole = r.whole;
      if (static_cast<double>(activation_bytes(spec, t, kl)) <= budget) break;
    }
  }
  return r;
}

}  // namespace zeroshard
