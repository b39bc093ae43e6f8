"""Long sequences, each sequence split across ranks, below the engine that trains the result:
- sequence_parallel, sequence_groups: Ulysses (DeepSpeed's DistributedAttention, the
  sequence-parallel groups, the gathered loss's share); gloo_gather_backward: torch's
  differentiable all_gather over a Gloo subgroup made to work backward;
- ulysses_hf, sequence_batches, tiled_compute: ALST's Hugging Face path (Ulysses around
  transformers' attention, the batches sliced along the sequence, the tiled MLP and
  logits-with-loss);
- context_parallel: torch's ring attention over a mesh's cp dimension.
May import: _common, _activations and the C++ extension."""
