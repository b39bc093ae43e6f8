"""torch.distributed.nn's differentiable all_gather over a Gloo subgroup, made to work.

Its backward on Gloo (torch.distributed.nn.functional._AllGather.backward, torch 2.6 to
2.11) emulates a reduce-scatter with _AlltoAll, which scatters from each member in turn
and passes the member's rank in the group where torch.distributed.scatter takes its rank in
the world. Over a group of ranks 0..p-1 the two agree; over any other (the second
sequence-parallel group of SP=2 x DP=2: ranks 2 and 3) the backward raises "Global rank 0
is not part of group". ALST's loss is gathered that way over the sequence-parallel group,
so on CPU ranks every layout with more than one data-parallel group failed in backward.

`install()` wraps _AlltoAll.forward: on Gloo it scatters from each member's rank in the
world; every other backend, and torch's own result, is untouched. Installed when
sequence-parallel groups are made (sequence_groups)."""
import torch.distributed as dist
from torch.distributed.nn import functional as _collectives

_installed = []  # torch's own forward, once wrapped


def _scatter_from_each_member(ctx, group, out_tensor_list, *tensors):
    ctx.group = group
    size = dist.get_world_size(group=group)
    ctx.input_tensor_size_list = [tensors[i].size() for i in range(size)]
    mine = dist.get_rank(group=group)
    tensors = [t.contiguous() for t in tensors]
    for member in range(size):
        dist.scatter(out_tensor_list[member], tensors if member == mine else None,
                     src=dist.get_global_rank(group, member), group=group)
    return tuple(out_tensor_list)


def install():
    """Wraps _AlltoAll.forward (once per process); a torch without it is left as it is."""
    all_to_all = getattr(_collectives, "_AlltoAll", None)
    if _installed or all_to_all is None:
        return
    torch_forward = all_to_all.forward
    _installed.append(torch_forward)

    def forward(ctx, group, out_tensor_list, *tensors):
        gloo = dist.get_backend(group=group) == dist.Backend.GLOO
        if gloo and group is not None and group is not dist.group.WORLD:
            return _scatter_from_each_member(ctx, group, out_tensor_list, *tensors)
        return torch_forward(ctx, group, out_tensor_list, *tensors)

    all_to_all.forward = staticmethod(forward)
