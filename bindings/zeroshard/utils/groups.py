"""deepspeed.utils.groups: the process groups by DeepSpeed's getters, for the axes
zeroshard has. Without sequence-parallel groups a sequence-parallel size is 1 and its rank
0, as DeepSpeed's; the sequence-data-parallel group (the ranks ZeRO shards over) is every
rank. DeepSpeed's expert-parallel registry is refused by name (_common/refusals.py)."""
import torch.distributed as dist

from .. import _zeroshard
from .._common import refusals as _refusals
from .._sequence import sequence_groups as _sequence_groups

__getattr__ = _refusals.attribute_refuser(__name__)


class NoGroup(_zeroshard.Error, KeyError):
    """No such group (a KeyError, as DeepSpeed's)."""

    def __str__(self):
        return str(self.args[0])


def _sequence_mpu():
    if _sequence_groups._engine_mpu:
        return _sequence_groups._engine_mpu[0]
    return _sequence_groups.mpu() if _sequence_groups._groups else None


def _get_sequence_parallel_group():
    mpu = _sequence_mpu()
    if mpu is None:
        raise NoGroup("no sequence-parallel group: none is made; allowed: after "
                      "initialize_sequence_parallel(size), UlyssesSPAttentionHF."
                      "register_with_transformers(...) or initialize() with a config's "
                      "sequence_parallel_size above 1")
    return mpu.get_sequence_parallel_group()


def _get_sequence_parallel_world_size():
    mpu = _sequence_mpu()
    return 1 if mpu is None else mpu.get_sequence_parallel_world_size()


def _get_sequence_parallel_rank():
    mpu = _sequence_mpu()
    return 0 if mpu is None else mpu.get_sequence_parallel_rank()


def _get_data_parallel_group():
    return dist.group.WORLD


def _get_data_parallel_world_size():
    return dist.get_world_size()


def _get_data_parallel_rank():
    return dist.get_rank()


_get_sequence_data_parallel_group = _get_data_parallel_group
_get_sequence_data_parallel_world_size = _get_data_parallel_world_size
_get_sequence_data_parallel_rank = _get_data_parallel_rank
