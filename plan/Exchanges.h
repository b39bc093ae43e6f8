#pragma once
// The all-to-alls of expert and sequence parallelism: the bytes each rank puts into them in
// one micro-step (its forward, its backward, and the forward again of each recomputed
// block), as the Python package's exchanges send them. A rank's input to an all-to-all
// holds its own part too: (N - 1) / N of it crosses to the N - 1 other ranks (for experts,
// where routes spread evenly over them). An expert's rank returns the rows it was sent,
// which vary with the routing: for experts the figure is a rank's mean, exact for the
// group's total. docs/memory-model.md "Exchanges" derives them.
#include <cstdint>

#include "plan/MemoryModel.h"
#include "plan/ModelSpec.h"

namespace zeroshard {

struct LayerExchange {
  int64_t layers = 0;          // the layers that exchange
  int64_t forward_bytes = 0;   // one layer's forward
  int64_t backward_bytes = 0;  // one layer's backward
  int64_t forward_passes = 0;  // forwards over all layers: layers + those recomputed
  int64_t ranks = 1;           // the group each exchange spans
  int64_t micro_step_bytes() const {
    return forward_passes * forward_bytes + layers * backward_bytes;
  }
};

struct Exchanges {
  // Experts split over ranks (a Hugging Face mixture of experts under AutoEP,
  // bindings/zeroshard/_experts/hf_expert_parallel.py), per MoE layer: the counts, every
  // route's hidden row to its expert's rank and the expert's place there, the outputs back;
  // in backward both row exchanges reversed.
  LayerExchange experts;
  // Ulysses (bindings/zeroshard/_sequence/ulysses_hf.py), per attention layer: the slice's
  // positions gathered, queries, keys and values to head-sharded (key-value heads fewer than
  // the ranks repeated to one a rank), the output back; in backward the four reversed.
  // None for torch's ring attention (TrainingShape::ring_attention): see `ring`.
  LayerExchange sequence;
  // torch's ring attention (context_parallel over a cp mesh dimension), per attention layer,
  // with its default rotation (allgather): the rank's keys and values all-gathered once in
  // forward and once more in backward, and their gradients passed along the ring (an
  // all-to-all to the next rank) once per rank of the ring, in fp32 (torch's
  // convert_to_f32). No key-value head is repeated.
  LayerExchange ring;
};

// `shape`: the rank's micro-batch and whole sequence (seq) with its recomputed blocks and
// sequence-parallel size; `expert_parallel` from the config; `compute_bytes` the
// activations' element size.
Exchanges exchanges_of(const ModelSpec& spec, const TrainingShape& shape, int64_t expert_parallel,
                       int compute_bytes);

}  // namespace zeroshard
