"""The process groups zeroshard makes in Python (expert, sequence, tensor and pipeline groups)
and the errors of the collectives run on them.

torch.distributed.new_group's default timeout is torch's (30 minutes on Gloo, 10 on NCCL):
a collective one rank never joins would hang that long, where the engine's own collectives
stop within comm_timeout_seconds. Each group here is made with that timeout (300 s, the
config's default, until an engine is built) and given the engine's once it is known, so a
rank waiting in an expert or sequence exchange stops in the same time, with a message naming
the exchange and the group's ranks."""
import contextlib
from datetime import timedelta

import torch.distributed as dist

from .. import _zeroshard

DEFAULT_SECONDS = 300.0  # config/AutoKnobs.cpp: comm_timeout_seconds' default
_seconds = [DEFAULT_SECONDS]
_made = {}  # group: its ranks, for this rank's groups


def new_group(ranks):
    """torch.distributed.new_group(ranks) with the current timeout. A collective over the
    world: every rank calls it, for every group, in one order."""
    ranks = list(ranks)
    group = dist.new_group(ranks, timeout=timedelta(seconds=_seconds[0]))
    if dist.get_rank() in ranks:
        _made[group] = ranks
    return group


def set_timeout(seconds):
    """The engine's comm_timeout_seconds (None or "auto": the default), for the groups made
    before and after. torch without _set_pg_timeout keeps the earlier groups' timeout."""
    seconds = DEFAULT_SECONDS if seconds in (None, "auto") else float(seconds)
    if seconds <= 0 or seconds == _seconds[0]:
        return
    _seconds[0] = seconds
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        return
    for group in _made:
        setter(timedelta(seconds=seconds), group)


def _ranks_of(group):
    return _made.get(group) or list(range(dist.get_world_size(group)))


@contextlib.contextmanager
def named(what, group):
    """Runs a collective on `group`; its failure (a rank that never joined: a timeout; a rank
    gone: a closed connection) is raised naming `what`, the group's ranks and the timeout."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, _zeroshard.Error):
            raise
        raise _zeroshard.Error(
            f"rank {dist.get_rank()}: {what} over ranks {_ranks_of(group)} failed "
            f"(comm_timeout_seconds {_seconds[0]:g}): {e}; a rank did not join it: every "
            "rank of the group must run the same collectives in the same order") from e
