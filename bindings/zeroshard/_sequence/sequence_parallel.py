"""Ulysses sequence parallelism, with DeepSpeed's names (zeroshard.sequence.layer).

Each rank of a sequence-parallel group holds one slice of every sequence (rank r: tokens
r*s/p to (r+1)*s/p). Attention needs whole sequences, so around it an all-to-all turns "my
slice of the sequence, every head" into "the whole sequence, my 1/p of the heads" (head
block r on rank r); the model's own attention runs on that, causal masks and all, and a
second all-to-all turns its output back into the rank's slice with every head. Everything
outside attention (projections, norms, MLPs, the loss) is per token and runs on the slice.

Gradients: each all-to-all's backward is the all-to-all the other way. The parameters are
replicated over the group (ZeRO shards them as it shards over data-parallel ranks: the
group's ranks are more shards, not replicas), so the engine's average of the gradients over
every rank is the gradient of the mean of the ranks' losses: with each rank's loss the mean
over its own tokens, that is the whole sequence's mean when the slices are equal, as with
DeepSpeed, whose ZeRO averages over its sequence-data-parallel group (every rank).

Layouts, as DeepSpeed's: batch first [b, s, heads, head_dim] (batch_dim_idx 0) or sequence
first [s, b, heads, head_dim] (batch_dim_idx 1). The head count of the query and of the key
and value (fewer under grouped-query attention) must both divide by the group's size, so
that a query head lands on the rank that holds its key-value head.
"""
import warnings

import torch
import torch.distributed as dist

from .. import _zeroshard
from .._common import process_groups


def _check_heads(heads, num_kv_heads, size):
    if num_kv_heads is not None and num_kv_heads < size:
        raise _zeroshard.Error(
            f"DistributedAttention: {num_kv_heads} key-value heads over a sequence-parallel "
            f"group of {size} ranks leave a rank no head to attend over; allowed: at least "
            f"{size} key-value heads (or a group of at most {num_kv_heads} ranks)")
    for what, count in (("query", heads), ("key-value", num_kv_heads)):
        if count is not None and count % size:
            raise _zeroshard.Error(
                f"DistributedAttention: {count} {what} heads do not split evenly over a "
                f"sequence-parallel group of {size} ranks; allowed: a head count divisible by "
                f"{size} (DeepSpeed's uneven split of heads is not in zeroshard)")


def _heads_to_sequence(x, batch_dim_idx, group):
    """[b, s/p, H, d] -> [b, s, H/p, d] (or sequence first): every rank's slice of the
    sequence, this rank's block of heads."""
    p = dist.get_world_size(group)
    seq_dim = 1 if batch_dim_idx == 0 else 0
    *lead, heads, head_dim = x.shape  # heads checked by single_all_to_all
    # [p, lead..., H/p, d]: block j goes to rank j.
    send = x.reshape(*lead, p, heads // p, head_dim).movedim(-3, 0).contiguous()
    recv = torch.empty_like(send)
    with process_groups.named("Ulysses' all-to-all (sequence slices to head blocks)", group):
        dist.all_to_all_single(recv, send, group=group)
    # recv[i] is rank i's slice: lay the slices along the sequence in rank order.
    out = recv.movedim(0, seq_dim)  # [.., p, s/p, ..]
    shape = list(lead)
    shape[seq_dim] *= p
    return out.reshape(*shape, heads // p, head_dim)


def _sequence_to_heads(x, batch_dim_idx, group):
    """[b, s, H/p, d] -> [b, s/p, H, d] (or sequence first): the way back."""
    p = dist.get_world_size(group)
    seq_dim = 1 if batch_dim_idx == 0 else 0
    *lead, heads, head_dim = x.shape
    if lead[seq_dim] % p:
        raise _zeroshard.Error(f"DistributedAttention: a sequence of {lead[seq_dim]} tokens does not "
                          f"split over {p} ranks; allowed: a length divisible by {p}")
    split = list(lead)
    split[seq_dim:seq_dim + 1] = [p, lead[seq_dim] // p]
    send = x.reshape(*split, heads, head_dim).movedim(seq_dim, 0).contiguous()
    recv = torch.empty_like(send)
    with process_groups.named("Ulysses' all-to-all (head blocks back to sequence slices)", group):
        dist.all_to_all_single(recv, send, group=group)
    # recv[i] holds rank i's block of heads for this rank's slice: heads in rank order.
    out = recv.movedim(0, -3)  # [.., p, H/p, d]
    local = list(lead)
    local[seq_dim] //= p
    return out.reshape(*local, heads * p, head_dim)


def single_all_to_all(input, scatter_idx, gather_idx, batch_dim_idx, group, async_op=False,
                      handle=None, type=None, num_kv_heads=None):
    """DeepSpeed's exchange: with scatter_idx 2 (or more) the heads are scattered and the
    sequence gathered; below 2, the way back. Runs at once (async_op is not taken)."""
    if async_op:
        raise _zeroshard.Error("single_all_to_all: async_op=True (DeepSpeed's overlap of the "
                          "exchanges on a side stream) is not in zeroshard; allowed: False")
    if scatter_idx >= 2:
        _check_heads(input.shape[2], num_kv_heads, dist.get_world_size(group))
        return _heads_to_sequence(input, batch_dim_idx, group)
    return _sequence_to_heads(input, batch_dim_idx, group)


class _SeqAllToAll(torch.autograd.Function):
    """The exchange with its gradient: the same exchange the other way."""

    @staticmethod
    def forward(ctx, group, input, scatter_idx, gather_idx, batch_dim_idx=1, stream=None,
                handle=None, type=None, is_fwd=True, num_kv_heads=None):
        ctx.group, ctx.scatter_idx, ctx.gather_idx = group, scatter_idx, gather_idx
        ctx.batch_dim_idx = batch_dim_idx
        return single_all_to_all(input, scatter_idx, gather_idx, batch_dim_idx, group,
                                 num_kv_heads=num_kv_heads)

    @staticmethod
    def backward(ctx, grad):
        back = single_all_to_all(grad.contiguous(), ctx.gather_idx, ctx.scatter_idx,
                                 ctx.batch_dim_idx, ctx.group)
        return (None, back) + (None,) * 8


def _rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary_pos_emb(t, freqs_cos, freqs_sin):
    """Rotary embedding on the first rot_dim (= freqs' last dim) channels of t; the rest
    pass through. freqs broadcast against t."""
    rot_dim = freqs_cos.shape[-1]
    rotated, passed = t[..., :rot_dim], t[..., rot_dim:]
    rotated = rotated * freqs_cos + _rotate_half(rotated) * freqs_sin
    return rotated if passed.shape[-1] == 0 else torch.cat((rotated, passed), dim=-1)


class DistributedAttention(torch.nn.Module):
    """DeepSpeed's DistributedAttention(local_attention, sequence_process_group,
    scatter_idx=2, gather_idx=0, sp_stream=None, num_kv_heads=None): forward(query, key,
    value, batch_dim_idx, rotary_pos_emb=None, *args, **kwargs) takes this rank's slice of
    the sequence with every head, runs local_attention(q, k, v, *args, **kwargs) on the whole
    sequence with this rank's heads, and returns this rank's slice with every head.
    rotary_pos_emb: (cos, sin) for the whole sequence, each [s, 1 or b, 1, rot_dim] as
    Megatron's rotary embedding gives them, applied to the query and key after the exchange
    (where each rank has every position)."""

    def __init__(self, local_attention, sequence_process_group, scatter_idx=2, gather_idx=0,
                 sp_stream=None, num_kv_heads=None):
        super().__init__()
        if scatter_idx < 2:
            raise _zeroshard.Error(f"DistributedAttention: scatter_idx={scatter_idx}; allowed: 2 "
                              "(the head dimension, scattered before attention)")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx, self.gather_idx = scatter_idx, gather_idx
        self.num_kv_heads = num_kv_heads
        self.sp_stream = sp_stream
        self.sp_overlap_comm = False
        self.overlap_handles = None
        if sp_stream is not None:
            warnings.warn("DistributedAttention: sp_stream is given; zeroshard runs the "
                          "all-to-alls on the current stream, one after another (the results "
                          "are the same, without DeepSpeed's overlap)", stacklevel=2)

    def layer_sync(self, layer):
        """DeepSpeed waits here for a side stream's event; with no side stream, nothing."""

    def forward(self, query, key, value, batch_dim_idx, rotary_pos_emb=None, *args,
                **kwargs):
        kv_heads = self.num_kv_heads if self.num_kv_heads is not None else key.shape[2]
        q, k, v = (_SeqAllToAll.apply(self.spg, x, self.scatter_idx, self.gather_idx,
                                      batch_dim_idx, None, None, None, True, kv_heads)
                   for x in (query, key, value))
        if rotary_pos_emb is not None:
            cos, sin = rotary_pos_emb
            if batch_dim_idx == 0:  # given sequence first, as Megatron's; DeepSpeed permutes
                cos, sin = cos.permute(1, 0, 2, 3), sin.permute(1, 0, 2, 3)
            q = apply_rotary_pos_emb(q, cos, sin)
            k = apply_rotary_pos_emb(k, cos, sin)
        context = self.local_attn(q, k, v, *args, **kwargs)
        return _SeqAllToAll.apply(self.spg, context, self.gather_idx, self.scatter_idx,
                                  batch_dim_idx, None, None, None, True, kv_heads)
