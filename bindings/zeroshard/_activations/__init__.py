"""Activation memory, the memory model's M_a: what a model's activations take, for the
planner (shapes), and DeepSpeed's activation checkpointing with its config keys
(checkpointing: deepspeed.checkpointing's API, inputs kept whole, in host RAM, or split
across the tensor-parallel ranks).
May import: _common and the C++ extension."""
