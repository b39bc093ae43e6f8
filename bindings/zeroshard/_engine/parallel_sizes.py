"""The engine's sizes and places along each parallel axis, by DeepSpeed's names: a mixin of
ZeroShardEngine (engine.py), read off the C++ engine's layout (engine/ParallelDims.h)."""
from .._sequence import sequence_groups as _sequence_groups


class ParallelSizes:
    @property
    def rank(self):
        return self._engine.rank

    @property
    def world_size(self):
        """The data-parallel ranks, as DeepSpeed's engine counts them with an mpu: every rank
        without tensor parallelism, world / tp with it."""
        return self._engine.data_parallel_size

    @property
    def data_parallel_rank(self):
        """This rank among the data-parallel ranks (its rank // tp // sp): the share of the
        data it trains on; every rank of a tensor- or sequence-parallel group takes the same."""
        return self._engine.data_parallel_rank // self._engine.sequence_parallel_size

    @property
    def dp_world_size(self):
        """Data-parallel ranks: world / tensor-parallel size / sequence-parallel size."""
        return self._engine.data_parallel_size // self._engine.sequence_parallel_size

    @property
    def seq_dp_world_size(self):
        """The ranks ZeRO shards over: dp_world_size x sequence_parallel_size."""
        return self._engine.data_parallel_size

    @property
    def sequence_parallel_size(self):
        return self._engine.sequence_parallel_size

    def get_sequence_parallel_group(self):
        """This rank's sequence-parallel group (None without sequence parallelism)."""
        return _sequence_groups.made(self._engine.sequence_parallel_size)

    seq_parallel_group = property(get_sequence_parallel_group)

    @property
    def mp_world_size(self):
        """Tensor-parallel ranks (1 without an mpu or tensor_parallel.autotp_size)."""
        return self._engine.tensor_parallel_size
