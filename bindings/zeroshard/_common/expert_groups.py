"""DeepSpeed's expert-parallel process groups, laid out as its
_create_expert_and_data_parallel lays them out: for an ep_size N, expert-parallel (EP)
groups of N consecutive ranks, each holding every expert once between them, and
expert-data-parallel (EDP) groups of the ranks N apart, those holding the same experts.
Both are named after the MoE layers' group name, "ep_size_N", made once per name by every
rank in one order (torch.distributed.new_group is a collective over the world).

The engine reduces and shards the experts' gradients over the EDP ranks through groups of
its own (engine/ParallelDims.h ep, edp: the same ranks); these are the ones the MoE layers'
all-to-all runs over and DeepSpeed's getters (zeroshard.utils.groups) return."""
import torch.distributed as dist

from .. import _zeroshard
from . import launch as _launch, process_groups

_expert_parallel = {}  # group name: this rank's EP group
_expert_data_parallel = {}  # group name: this rank's EDP group
_ranks = {}  # group name: (this rank's EP ranks, its EDP ranks)


def make(ep_size, use_data_before_expert_parallel=False):
    """This rank's EP group's name for ep_size, made on first use. A collective."""
    name = f"ep_size_{ep_size}"
    if name in _expert_parallel:
        return name
    if use_data_before_expert_parallel:
        raise _zeroshard.Error(
            "use_data_before_expert_parallelism is true: expert-parallel groups of ranks that "
            "lie apart are not laid out here; allowed: false (DeepSpeed's default: consecutive "
            "ranks split the experts)")
    _launch.init_distributed()
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % ep_size:
        raise _zeroshard.Error(
            f"deepspeed.moe.layer.MoE: ep_size={ep_size} does not divide the {world} ranks; "
            "allowed: a divisor of the ranks")
    for first in range(ep_size):  # DeepSpeed's order: the EDP groups, then the EP groups
        ranks = list(range(first, world, ep_size))
        group = process_groups.new_group(ranks)
        if rank in ranks:
            _expert_data_parallel[name], edp_ranks = group, ranks
    for first in range(0, world, ep_size):
        ranks = list(range(first, first + ep_size))
        group = process_groups.new_group(ranks)
        if rank in ranks:
            _expert_parallel[name], ep_ranks = group, ranks
    _ranks[name] = (ep_ranks, edp_ranks)
    return name


def expert_parallel_group(name):
    return _expert_parallel[_known(name)]


def expert_data_parallel_group(name):
    return _expert_data_parallel[_known(name)]


def expert_parallel_ranks(name):
    return _ranks[_known(name)][0]


def expert_data_parallel_ranks(name):
    return _ranks[_known(name)][1]


def names():
    return sorted(_expert_parallel)


def _known(name):
    if name not in _expert_parallel:
        made = ", ".join(names()) or "none yet"
        raise KeyError(f"no expert-parallel group named {name!r}; made: {made} (the engine "
                       "makes one per ep_size of the model's MoE layers at initialize)")
    return name
