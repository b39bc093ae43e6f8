"""deepspeed.sequence.layer: Ulysses' DistributedAttention and its exchange."""
from .._sequence.sequence_parallel import (  # noqa: F401
    DistributedAttention, _SeqAllToAll, apply_rotary_pos_emb, single_all_to_all)
