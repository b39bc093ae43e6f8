"""zeroshard.checkpointing: deepspeed.checkpointing's names (Megatron-DeepSpeed's
`deepspeed.checkpointing.configure(...)`, `checkpoint(...)`, its RNG tracker), as
zeroshard/_activations/checkpointing.py gives them."""
from ._activations.checkpointing import (  # noqa: F401
    CudaRNGStatesTracker, checkpoint, configure, get_cuda_rng_tracker, is_configured,
    model_parallel_cuda_manual_seed, model_parallel_reconfigure_tp_seed,
    held_bytes, partition_activations_in_checkpoint, reset, set_num_layers)
from ._common import refusals as _refusals  # noqa: E402

# A DeepSpeed name of this module that zeroshard lacks is refused by name.
__getattr__ = _refusals.attribute_refuser(__name__)
