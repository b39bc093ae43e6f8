"""deepspeed.runtime.sequence_parallel.parallel_state_sp: the sequence-parallel groups, an
mpu for them (get_model_parallel_* name the sequence-parallel group, as DeepSpeed's do)."""
from ..._sequence.sequence_groups import (  # noqa: F401
    _release_sequence_parallel_groups, get_model_parallel_group, get_model_parallel_rank,
    get_model_parallel_world_size, get_sequence_data_parallel_group,
    get_sequence_data_parallel_rank, get_sequence_data_parallel_world_size,
    get_sequence_parallel_group, get_sequence_parallel_rank, get_sequence_parallel_world_size,
    initialize_sequence_parallel)
