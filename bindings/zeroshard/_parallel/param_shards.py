"""A parameter's shard while zeroshard.init builds a model (_engine/construction.py): each
rank keeps 1/d of its values and the parameter holds a NaN spread over its shape; gathered
whole for an operation that touches it, then sharded again. The d ranks are the world's, or for
an expert of DeepSpeed's MoE layer split over ep ranks (DeepSpeed's marks: allreduce False,
group_name ep_size_N) the ranks holding the same experts, its expert-data-parallel group:
the other ranks hold other experts, whose values must not be replaced by rank 0's."""
import contextlib
import ctypes
import math
import weakref

import torch
import torch.distributed as dist

from .._common import expert_groups


def is_sharded(param):
    """True for a parameter zeroshard.init left as a shard (its values elsewhere)."""
    return getattr(param, "_zs_shard", None) is not None


def give_back_freed_memory():
    """glibc keeps what it freed (its mmap threshold rises to the largest block freed, so
    the next parameters come from the heap and their freed pages stay resident): measured,
    a 0.4 GB GPT built sharded on 2 ranks peaked at 1.23x the model without this, 0.65x
    with it. malloc_trim gives free pages back (in the middle of the heap too)."""
    if _libc is not None:
        _libc.malloc_trim(0)


def _load_libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_libc = _load_libc()


def poison(like_shape, dtype, device=None):
    fill = float("nan") if dtype.is_floating_point or dtype.is_complex else 0
    return torch.full((), fill, dtype=dtype, device=device).expand(like_shape)


class Sharder:
    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.pending = {}   # id -> parameter registered, not yet sharded
        self.touched = {}   # id -> sharded parameter gathered by an operation
        self.busy = False   # inside its own operations, which the mode lets through
        self.attached = weakref.WeakSet()  # modules whose __init__ is over

    @contextlib.contextmanager
    def own_operations(self):
        was, self.busy = self.busy, True
        try:
            with torch.no_grad():
                yield
        finally:
            self.busy = was

    def ranks(self, param):
        """(group, its ranks, this rank's place among them) `param` is sharded over: the
        world's (group None), or a split expert's expert-data-parallel ranks."""
        name = getattr(param, "group_name", None)
        if getattr(param, "allreduce", True) is False and isinstance(name, str) \
                and name.startswith("ep_size_") and int(name[len("ep_size_"):]) > 1:
            expert_groups.make(int(name[len("ep_size_"):]))  # a collective: all build alike
            ranks = expert_groups.expert_data_parallel_ranks(name)
            return expert_groups.expert_data_parallel_group(name), ranks, ranks.index(self.rank)
        return None, list(range(self.world)), self.rank

    def shard_numel(self, param):
        return math.ceil(param.numel() / len(self.ranks(param)[1]))

    def broadcast(self, param, modifier_rank=0, values=None):
        """Every rank of `param`'s group gets the values (`values`, a contiguous tensor of
        them; else param.data) of the rank `modifier_rank` is, or for a split expert of the
        rank of its group placed as `modifier_rank` is in its own (the ranks holding the
        same experts: ep_size apart)."""
        group, ranks, _ = self.ranks(param)
        if len(ranks) > 1:
            ep = self.world // len(ranks)
            dist.broadcast(param.data if values is None else values, ranks[modifier_rank // ep],
                           group=group)

    def shard(self, param):
        with self.own_operations():
            full = param.data.contiguous()
            self.broadcast(param, values=full)
            flat = full.reshape(-1)
            s, place = self.shard_numel(param), self.ranks(param)[2]
            mine = torch.zeros(s, dtype=flat.dtype)
            begin = min(place * s, flat.numel())
            end = min(begin + s, flat.numel())
            mine[:end - begin] = flat[begin:end]
            param._zs_shard = mine
            param.data = poison(param.shape, param.dtype)

    def gather(self, param):
        """Makes `param` whole on every rank (a collective); its shard stays."""
        with self.own_operations():
            group, ranks, _ = self.ranks(param)
            size = len(ranks)
            shard = param._zs_shard
            out = torch.empty(shard.numel() * size, dtype=shard.dtype)
            if size > 1:
                dist.all_gather(list(out.chunk(size)), shard, group=group)
            else:
                out.copy_(shard)
            param.data = out[:param.numel()].view(param.shape)

    def reshard(self, param):
        """After a gather: this rank's slice of the (possibly rewritten) values."""
        with self.own_operations():
            s = self.shard_numel(param)
            flat = param.data.reshape(-1)
            begin = min(self.ranks(param)[2] * s, flat.numel())
            end = min(begin + s, flat.numel())
            param._zs_shard[:end - begin] = flat[begin:end]
            param.data = poison(param.shape, param.dtype)

    def drop(self, param):
        """After a gather: back to the shard, the values written since discarded."""
        param.data = poison(param.shape, param.dtype)

    def on_parameter(self, module, name, param):
        if param is None or param.is_meta or is_sharded(param):
            return
        if module in self.attached:
            # Set after construction (from_pretrained loading a tensor into a module
            # built on meta, a re-tied head): its value is final, shard it now.
            self.flush()
            self.shard(param)
            give_back_freed_memory()
        else:
            self.pending[id(param)] = param

    def on_module(self, parent, name, child):
        self.flush()
        if child is None:
            return
        self.attached.update(child.modules())
        sharded = 0
        for p in child.parameters():
            if self.pending.pop(id(p), None) is not None:
                self.shard(p)
                sharded += 1
        if sharded:
            give_back_freed_memory()

    def touch(self, params):
        """Whole for the operation about to run: `params`, and no other (so a loop that
        initialises every parameter in turn holds one at a time)."""
        ids = {id(p) for p in params}
        stale = [k for k in self.touched if k not in ids]
        for key in stale:
            self.reshard(self.touched.pop(key))
        if stale:
            give_back_freed_memory()
        for p in params:
            if id(p) not in self.touched:
                self.gather(p)
                self.touched[id(p)] = p

    def flush(self):
        """Shards again every parameter an operation gathered."""
        for p in self.touched.values():
            self.reshard(p)
        self.touched.clear()

    def finish(self):
        self.flush()
        for p in self.pending.values():
            self.shard(p)
        self.pending.clear()
        give_back_freed_memory()
