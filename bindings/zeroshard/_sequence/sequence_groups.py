"""The sequence-parallel process groups, as DeepSpeed's parallel_state_sp makes them
(zeroshard.runtime.sequence_parallel.parallel_state_sp): consecutive ranks form a
sequence-parallel group (ranks 0..p-1, p..2p-1, ...); every rank together forms the
sequence-data-parallel group, over which ZeRO shards the state and reduces the gradients."""
import collections
import sys

import torch.distributed as dist

from .. import _zeroshard
from .._common import launch as _launch, process_groups
from . import gloo_gather_backward

_groups = {}  # "sp", "sp_dp": the groups initialize_sequence_parallel made
_engine_mpu = []  # an mpu of such groups an engine was given


def _error(message):
    return _zeroshard.Error(f"initialize_sequence_parallel: {message}")


def initialize_sequence_parallel(sequence_parallel_size):
    """Makes the groups; every rank calls it, with the same size."""
    if not dist.is_initialized():
        raise _error("torch.distributed is not initialized; call zeroshard.init_distributed() "
                     "(or start the ranks with torchrun) first")
    if _groups:
        raise _error("the sequence-parallel groups are already made; allowed: one call")
    world = dist.get_world_size()
    size = sequence_parallel_size
    if not isinstance(size, int) or size <= 1 or size > world or world % size:
        raise _error(f"sequence_parallel_size={size!r} over {world} ranks; allowed: an integer "
                     f"above 1 that divides the world size {world}")
    rank = dist.get_rank()
    for start in range(0, world, size):
        ranks = list(range(start, start + size))
        group = process_groups.new_group(ranks)
        if rank in ranks:
            _groups["sp"] = group
    _groups["sp_dp"] = process_groups.new_group(list(range(world)))
    gloo_gather_backward.install()  # ALST's loss is gathered over these groups


def mpu():
    """These groups as an mpu for initialize(mpu=...), as parallel_state_sp is one."""
    return sys.modules[__name__]


def made_with(size):
    """Whether the groups are made already, of `size` ranks (made of another size: an
    error, as a second initialize_sequence_parallel would be)."""
    if not _groups:
        return False
    if get_sequence_parallel_world_size() != size:
        raise _error(f"sequence_parallel_size={size}, but the groups were made with "
                     f"{get_sequence_parallel_world_size()}; allowed: the same size")
    return True


def of_mpu(mpu):
    """(sequence-parallel size, the mpu left for tensor and pipeline parallelism): an mpu
    of Ulysses' groups (parallel_state_sp's, or one like it) has
    get_sequence_parallel_world_size and no get_data_parallel_world_size, as DeepSpeed tells
    them apart; its model-parallel names are its sequence-parallel group, not a
    tensor-parallel one. Its groups must be consecutive ranks, as the engine counts them."""
    if (mpu is None or hasattr(mpu, "get_data_parallel_world_size")
            or not hasattr(mpu, "get_sequence_parallel_world_size")):
        return 0, mpu
    size = int(mpu.get_sequence_parallel_world_size())
    rank = int(mpu.get_sequence_parallel_rank())
    if size > 1 and rank != dist.get_rank() % size:
        raise _zeroshard.Error(
            f"zeroshard.initialize: mpu: rank {dist.get_rank()} is sequence-parallel rank "
            f"{rank} of {size}; zeroshard's groups are consecutive ranks: allowed: rank "
            f"{dist.get_rank() % size}")
    _engine_mpu[:] = [mpu]
    gloo_gather_backward.install()
    return size, None


def made(size):
    """The sequence-parallel group for an engine whose config names `size` ranks: made now
    if not yet (None for size 1); one made before must be of that size."""
    if size == 1:
        return None
    if _engine_mpu:
        return _engine_mpu[0].get_sequence_parallel_group()
    if not _groups:
        initialize_sequence_parallel(size)
    elif get_sequence_parallel_world_size() != size:
        raise _error(f"the config's sequence_parallel_size is {size}, but the groups were made "
                     f"with {get_sequence_parallel_world_size()}; allowed: the same size in both")
    return _groups["sp"]


_GATHERED_LOSS_SEARCH = 256  # autograd nodes searched from the loss: the gather is near it


def replicated_loss_scale(loss, group):
    """1/p where every rank's loss was made whole over the sequence-parallel group by
    torch.distributed.nn's differentiable all-gather or all-reduce (ALST's loss: each
    slice's loss gathered and weighted by its tokens), else 1. Such a loss is the same on
    the group's p ranks, and the collective's backward sums each rank's gradient over the
    group, so the group's gradients add up to p times the loss's; a loss that is each rank's
    share of the group's (DistributedAttention's usual one) adds up to it once. DeepSpeed
    divides by the data-parallel size at ZeRO 1 and 2 and by every rank at ZeRO 3, right for
    one of the two losses at each stage; the engine divides by the data-parallel size and by
    this, right for both."""
    if group is None or loss.grad_fn is None:
        return 1.0
    from torch.distributed.nn import functional as collectives
    summing = tuple(getattr(collectives, name, None)
                    for name in ("_AllGather", "_AllGatherBase", "_AllReduce"))
    ranks = dist.get_process_group_ranks(group)
    seen, todo = set(), collections.deque([loss.grad_fn])  # breadth first: nearest first
    while todo and len(seen) < _GATHERED_LOSS_SEARCH:
        node = todo.popleft()
        if node is None or node in seen:
            continue
        seen.add(node)
        if getattr(type(node), "_forward_cls", None) in summing:
            over = getattr(node, "group", None) or dist.group.WORLD
            if dist.get_process_group_ranks(over) == ranks:
                return 1.0 / len(ranks)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return 1.0


def _get(kind, what):
    if kind not in _groups:
        raise _zeroshard.Error(f"the {what} group is not made; call "
                               "initialize_sequence_parallel(size) first")
    return _groups[kind]


def get_sequence_parallel_group():
    return _get("sp", "sequence-parallel")


def get_sequence_data_parallel_group():
    return _get("sp_dp", "sequence-data-parallel")


def get_sequence_parallel_world_size():
    return dist.get_world_size(get_sequence_parallel_group())


def get_sequence_data_parallel_world_size():
    return dist.get_world_size(get_sequence_data_parallel_group())


def get_sequence_parallel_rank():
    return dist.get_rank(get_sequence_parallel_group())


def get_sequence_data_parallel_rank():
    return dist.get_rank(get_sequence_data_parallel_group())


# DeepSpeed's parallel_state_sp names its sequence-parallel group the model-parallel one.
get_model_parallel_rank = get_sequence_parallel_rank
get_model_parallel_world_size = get_sequence_parallel_world_size
get_model_parallel_group = get_sequence_parallel_group


def _release_sequence_parallel_groups():
    _groups.clear()
    _engine_mpu.clear()


_launch.forget_at_exit(_release_sequence_parallel_groups)
