#include "plan/Exchanges.h"

#include <algorithm>

namespace zeroshard {
namespace {

constexpr int64_t kIndexBytes = 8;  // int64: counts, positions, routes' expert places
constexpr int64_t kFp32Bytes = 4;   // the ring's gradients of keys and values

int64_t head_dim(const ModelSpec& spec) {
  return spec.head_dim > 0 ? spec.head_dim : spec.hidden / spec.heads;
}

// Blocks that run their forward again in backward: recomputed whole or by their ops (an
// exchange is no matmul or attention kernel, so selective recomputation repeats it too),
// or all of them under the model's own gradient checkpointing.
int64_t recomputed_blocks(const ModelSpec& spec, const TrainingShape& shape) {
  if (shape.activation_checkpointing) return spec.layers;
  return std::min(spec.layers, shape.recomputed.whole + shape.recomputed.ops);
}

}  // namespace

Exchanges exchanges_of(const ModelSpec& spec, const TrainingShape& shape, int64_t expert_parallel,
                       int compute_bytes) {
  Exchanges out;
  const int64_t b = compute_bytes;
  const int64_t again = recomputed_blocks(spec, shape);
  const int64_t sp = std::max<int64_t>(1, shape.sequence_parallel);
  const int64_t tokens = shape.micro_batch * shape.seq / sp;  // this rank's
  if (expert_parallel > 1 && spec.experts > 0) {
    LayerExchange& e = out.experts;
    e.ranks = expert_parallel;
    e.layers = std::count(spec.unit_expert.begin(), spec.unit_expert.end(), true);
    const int64_t routes = tokens * spec.experts_per_token;
    const int64_t rows = routes * spec.hidden * b;
    e.forward_bytes = expert_parallel * kIndexBytes + 2 * rows + routes * kIndexBytes;
    e.backward_bytes = 2 * rows;
    // A recomputed block's experts are each a unit of their own beside the block: the
    // block's forward again is its exchanges again.
    e.forward_passes = e.layers + std::min(again, e.layers);
  }
  const int64_t kv_heads = spec.kv_heads > 0 ? spec.kv_heads : spec.heads;
  if (sp > 1 && shape.ring_attention) {
    LayerExchange& r = out.ring;
    r.ranks = sp;
    r.layers = spec.layers;
    const int64_t kv = tokens * 2 * kv_heads * head_dim(spec);  // the rank's keys and values
    r.forward_bytes = kv * b;
    r.backward_bytes = kv * b + sp * kv * kFp32Bytes;
    r.forward_passes = r.layers + again;
  }
  if (sp > 1 && !shape.ring_attention) {
    LayerExchange& s = out.sequence;
    s.ranks = sp;
    s.layers = spec.layers;
    const int64_t d = head_dim(spec);
    const int64_t kv = std::max(kv_heads, sp);
    const int64_t per_head = tokens * d * b;        // one head of the rank's slice
    const int64_t heads = 2 * spec.heads + 2 * kv;  // queries and output, keys and values
    s.forward_bytes = tokens * kIndexBytes + heads * per_head;
    s.backward_bytes = heads * per_head;
    s.forward_passes = s.layers + again;
  }
  return out;
}

}  // namespace zeroshard
