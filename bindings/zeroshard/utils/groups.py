"""deepspeed.utils.groups: the process groups by DeepSpeed's getters, for the axes
zeroshard has. Without sequence-parallel groups a sequence-parallel size is 1 and its rank
0, as DeepSpeed's; the sequence-data-parallel group (the ranks ZeRO shards over) is every
rank. The expert-parallel groups are those the engine made for the model's MoE layers
(_common/expert_groups.py), by DeepSpeed's getters and group names ("ep_size_N")."""
import torch.distributed as dist

from .. import _zeroshard
from .._common import refusals as _refusals
from .._common import expert_groups as _expert_groups
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


def _get_expert_parallel_group(group_name):
    return _expert_groups.expert_parallel_group(group_name)


def _get_expert_data_parallel_group(group_name):
    return _expert_groups.expert_data_parallel_group(group_name)


def _get_expert_parallel_group_dict():
    return {n: _expert_groups.expert_parallel_group(n) for n in _expert_groups.names()}


def _get_expert_data_parallel_group_dict():
    return {n: _expert_groups.expert_data_parallel_group(n) for n in _expert_groups.names()}


def _get_expert_parallel_world_size(group_name):
    return len(_expert_groups.expert_parallel_ranks(group_name))


def _get_expert_data_parallel_world_size(group_name):
    return len(_expert_groups.expert_data_parallel_ranks(group_name))


def _get_expert_parallel_rank(group_name):
    return _expert_groups.expert_parallel_ranks(group_name).index(dist.get_rank())


def _get_expert_data_parallel_rank(group_name):
    return _expert_groups.expert_data_parallel_ranks(group_name).index(dist.get_rank())


def _get_expert_parallel_src_rank(group_name):
    """The first world rank of this rank's expert-parallel group."""
    return _expert_groups.expert_parallel_ranks(group_name)[0]


def _get_expert_broadcast_src_rank(group_name):
    """The first world rank of this rank's expert-data-parallel group (where the experts'
    initial values come from)."""
    return _expert_groups.expert_data_parallel_ranks(group_name)[0]


def _get_expert_parallel_group_ranks(group_name):
    return list(_expert_groups.expert_parallel_ranks(group_name))


def _get_expert_data_parallel_group_ranks(group_name):
    return list(_expert_groups.expert_data_parallel_ranks(group_name))


def _get_max_expert_size():
    """The largest ep_size of the groups made (1 without any)."""
    sizes = [len(_expert_groups.expert_parallel_ranks(n)) for n in _expert_groups.names()]
    return max(sizes, default=1)


def _get_max_expert_size_name():
    return f"ep_size_{_get_max_expert_size()}"


def _get_expert_model_parallel_world_size():
    """Tensor-parallel ranks of the experts: 1 (experts are not split inside one)."""
    return 1
