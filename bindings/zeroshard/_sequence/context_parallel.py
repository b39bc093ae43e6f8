"""Context parallelism: torch's ring attention (torch.distributed.tensor.experimental.
context_parallel) over the "cp" dimension of the mesh given to initialize(mesh=...), as
torchtitan lays it out (("dp", "cp"): a cp group is consecutive ranks).

The engine counts a cp group as it counts a sequence-parallel group (sequence_groups): its
ranks hold slices of the same samples, so a batch counts them once, ZeRO shards over every
rank, and the group's gradients are summed and divided by the data-parallel ranks alone:
each rank's loss is its share of the group's mean (its tokens' loss sum over the group's
token count, which the labels shifted before slicing give exactly, padding included).

torch's ring attention dispatches the CUDA kernels only (flash, efficient, cuDNN): on CPU
tensors sdpa's kernel (_scaled_dot_product_flash_attention_for_cpu) has no sharding rule
along the sequence, and context_parallel fails with "does not have a sharding strategy
registered". enable_cpu_ring_attention() gives it one, and runs torch's own ring (its
rotations, its head-tail load balancing, its merge of partial outputs by log-sum-exp) with
that kernel, whose output and log-sum-exp have the layout the ring merges. Installed when
an engine is given a mesh with a cp dimension; CUDA tensors never reach it."""
from .. import _zeroshard
from . import sequence_groups as _sequence_groups

CP = "cp"
_installed = []


def _error(message):
    return _zeroshard.Error(f"zeroshard.initialize: mesh: {message}")


class _CpGroups:
    """The mesh's cp group as an mpu of sequence-parallel groups (sequence_groups.of_mpu)."""

    def __init__(self, mesh):
        self._group = mesh[CP].get_group()
        self._size, self._rank = mesh[CP].size(), mesh.get_local_rank(CP)

    def get_sequence_parallel_group(self):
        return self._group

    def get_sequence_parallel_world_size(self):
        return self._size

    def get_sequence_parallel_rank(self):
        return self._rank


def of_mesh(mesh, loaded):
    """(cp size, the mesh left for tensor parallelism): 0 and `mesh` when it has no cp
    dimension. A cp dimension must be the last (its groups consecutive ranks, as the
    engine's sequence-split groups are), alone beside data parallelism."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if CP not in names:
        return 0, mesh
    size = mesh[CP].size()
    others = [n for n in names if n != CP and mesh[n].size() > 1]
    if names[-1] != CP:
        raise _error(f"dimensions {names}: the cp dimension must be the last (consecutive "
                     "ranks per cp group, as torchtitan lays out ('dp', 'cp')); allowed: "
                     "init_device_mesh(device, (dp, cp), mesh_dim_names=('dp', 'cp'))")
    if any(n not in ("dp", "dp_shard", "dp_replicate") for n in others):
        raise _error(f"dimensions {names}: context parallelism beside {others} is not composed "
                     "yet; allowed: ('dp', 'cp') or ('cp',)")
    if loaded.sequence_parallel_size > 1:
        raise _error(f"a cp dimension of {size} ranks and the config's sequence_parallel_size "
                     f"{loaded.sequence_parallel_size}; allowed: one of the two")
    if loaded.pipeline_parallel_size > 1:
        raise _error(f"a cp dimension of {size} ranks with pipeline.stages "
                     f"{loaded.pipeline_parallel_size}; allowed: one of the two")
    if size > 1:
        _sequence_groups.of_mpu(_CpGroups(mesh))
        enable_cpu_ring_attention()
    return size, None


def enable_cpu_ring_attention():
    """Lets torch's context_parallel run sdpa on CPU tensors (once per process)."""
    if _installed:
        return
    try:
        import torch
        from torch.distributed.tensor import DTensor, Replicate, Shard
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
        from torch.distributed.tensor._ops.utils import (expand_to_full_mesh_op_strategy,
                                                         register_op_strategy)
        from torch.distributed.tensor.experimental._context_parallel import _attention as ring
    except ImportError as e:
        raise _zeroshard.Error(
            "context parallelism on CPU tensors: this torch's ring attention is not where "
            f"zeroshard finds it in torch 2.11 ({e}); allowed: torch 2.11, or CUDA tensors")
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    seq_dim = 2  # [batch, heads, sequence, head_dim], as torch's ring takes them

    def ring_forward(mesh, query, key, value, dropout_p=0.0, is_causal=False, *,
                     attn_mask=None, scale=None):
        if attn_mask is not None:
            raise _zeroshard.Error("context parallelism: attention with a mask is not "
                                   "supported by torch's ring; allowed: causal attention "
                                   "(is_causal=True, no attn_mask)")
        return ring._templated_ring_attention(
            mesh.get_group(), seq_dim, forward, query=query, key=key, value=value,
            is_causal=is_causal, dropout_p=dropout_p, scale=scale)

    def ring_backward(mesh, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                      *, attn_mask=None, scale=None):
        return ring._templated_ring_attention_backward(
            mesh.get_group(), seq_dim, backward, grad_out=grad_out, grad_out_name="grad_out",
            query=query, key=key, value=value, out=out, logsumexp=logsumexp,
            is_causal=is_causal, dropout_p=dropout_p, scale=scale)

    def handler(op_call, args, kwargs):  # as torch's _sdpa_handler, with the CPU kernel
        dispatcher = DTensor._op_dispatcher
        info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        dispatcher.sharding_propagator.propagate(info)
        sharding = info.output_sharding
        if sharding is None or sharding.needs_redistribute:
            raise _zeroshard.Error("context parallelism: sdpa's inputs are not all sharded "
                                   "along the sequence (context_parallel's buffers)")
        run = ring_forward if op_call is forward else ring_backward
        return dispatcher.wrap(run(info.compute_mesh, *info.local_args, **info.local_kwargs),
                               sharding.output_spec)

    def strategy(outputs, inputs, validate=True):
        # Every tensor whole, or every tensor sharded along the sequence (the ring's case).
        def rule(op_schema):
            mesh = op_schema.get_mesh_from_args(validate=validate)
            tensors = outputs + inputs
            placements = [[Replicate()] * tensors, [Shard(seq_dim)] * tensors]
            return expand_to_full_mesh_op_strategy(mesh, op_schema, placements,
                                                   input_index=outputs)
        return rule

    # outputs (out, logsumexp | dq, dk, dv), then the tensor inputs (q, k, v | grad_out, q,
    # k, v, out, logsumexp); the schema's non-tensor arguments from dropout_p on.
    register_op_strategy(forward, schema_info=RuntimeSchemaInfo(3))(strategy(2, 3))
    register_op_strategy(backward, schema_info=RuntimeSchemaInfo(6))(strategy(3, 6, False))
    ring.custom_ops[forward] = handler  # merged into DTensor's handlers by context_parallel
    ring.custom_ops[backward] = handler
    _installed.append(True)
