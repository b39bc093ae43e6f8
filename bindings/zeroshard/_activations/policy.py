"""activation_checkpointing.mode: the model's blocks recomputed in backward by the engine, as
torchtitan's activation_checkpoint offers it: none, full (every block keeps only its input),
selective (every Nth block recomputed whole, or, with "op", every block keeping the outputs
of its matmuls and attention kernels and recomputing the rest), memory_budget (as many
blocks as keep the activations within that fraction of what none keeps, counted by the
planner for the batch trained on), auto (the fewest blocks with which the plan fits the
device at that batch: none where it fits without). torch's non-reentrant checkpoint runs
each block's own forward inside its hooks, so at stage 3 a block is gathered for its
backward before it is recomputed. The planner counts the same blocks (plan/MemoryModel.h
recomputed_layers). With activation_checkpointing.offload each block's forward runs inside
offload.py's hooks: what it saves (a recomputed block: its input) waits for backward in host
RAM or on NVMe."""
import functools
import types
import weakref

import torch
from torch.utils import checkpoint as torch_checkpoint

from .. import _zeroshard
from . import offload as _offload

_STACKS = (torch.nn.ModuleList, torch.nn.Sequential)
# The keyword arguments through which a transformers layer updates a key-value cache: a
# recompute would update it twice, so a recomputed block runs without one, as transformers'
# own gradient checkpointing does.
_CACHE_ARGUMENTS = ("past_key_value", "past_key_values", "layer_past")


def saved_ops():
    """The ops whose outputs a block under the "op" policy keeps: matmuls and attention
    kernels, whose recompute is what costs; those this torch has."""
    names = ("mm", "addmm", "bmm", "_scaled_mm", "_grouped_mm",
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    ops = set()
    for name in names:
        try:
            ops.add(getattr(torch.ops.aten, name).default)
        except AttributeError:
            pass
    return frozenset(ops)


def _keep_saved_ops(ops):
    def policy(_ctx, op, *_args, **_kwargs):
        return (torch_checkpoint.CheckpointPolicy.MUST_SAVE if op in ops
                else torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)
    return functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, policy)


def blocks(model):
    """The model's repeated blocks in forward order: transformers' layers (what its own
    gradient checkpointing recomputes), else the modules its _no_split_modules names, else
    the children with parameters of its outermost ModuleLists and Sequentials."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        GradientCheckpointingLayer = None
    named = set(getattr(model, "_no_split_modules", None) or ())

    def is_block(module):
        if GradientCheckpointingLayer and isinstance(module, GradientCheckpointingLayer):
            return True
        return type(module).__name__ in named

    found = _outermost(model, is_block)
    if found:
        return found
    return _outermost(model, None)


def _outermost(model, is_block):
    """Blocks no other block holds; is_block None: the children of stacks."""
    found, pending = [], [(model, False)]
    while pending:
        module, in_stack = pending.pop(0)
        chosen = is_block(module) if is_block is not None else (
            in_stack and any(True for _ in module.parameters())
            and type(module).forward is not torch.nn.Module.forward)
        if chosen and module is not model:
            found.append(module)
            continue
        kids = [c for c in module._modules.values() if c is not None]
        pending[0:0] = [(c, isinstance(module, _STACKS)) for c in kids]  # depth first, in order
    return found


class Recompute:
    """Which blocks a forward recomputes, for the config's mode. `counted()`: the engine's
    (whole, ops) layers for the batch it has seen, or None (memory_budget and auto read
    it)."""

    def __init__(self, counted, model, mode, option, budget, offload=None):
        # Neither the model nor the engine is held: each block holds this, and a cycle would
        # leave a dropped model to the cyclic collector, an engine kept by its model would
        # outlive its ZeroShardEngine.
        self.counted, self.model, self.mode = counted, weakref.ref(model), mode
        self.budget, self.offload = budget, offload
        found = blocks(model)
        if not found:
            what = (f"activation_checkpointing.mode '{mode}'" if mode != "none" else
                    "activation_checkpointing.offload")
            raise _zeroshard.Error(
                f"{what}: the model (a {type(model).__name__}) has no blocks to "
                f"{'recompute' if mode != 'none' else 'offload'} (no transformers layer, no "
                "module with parameters in a ModuleList or Sequential); allowed: mode none "
                "without offload, or a model that holds its blocks in a ModuleList")
        n = len(found)
        if mode == "full":
            self.how = ["whole"] * n
        elif mode == "none":  # offload only
            self.how = [None] * n
        elif mode == "selective" and option == "op":
            self.how = ["ops"] * n
        elif mode == "selective":
            every = int(option)  # blocks N, 2N, ... as torchtitan counts them
            self.how = ["whole" if (i + 1) % every == 0 else None for i in range(n)]
        else:
            self.how = [None] * n  # memory_budget, auto: decided at each forward
        self.counted_at = None  # the engine's batch count they last decided at
        self.saved = _keep_saved_ops(saved_ops())
        self.cache_warned = False
        for index, block in enumerate(found):
            _wrap(block, self, index)

    def __deepcopy__(self, memo):
        """One policy for a model and its copies (a reference model copied from it): each
        block it runs is passed to it."""
        return self

    def begin_forward(self, told=None):
        """A forward of the model begins (after the engine has seen its batch). `told`: how
        many batches the engine has been told of; memory_budget and auto decide again when
        it changes (None: every forward)."""
        model = self.model()
        if self.offload is not None:
            self.offload.begin_forward()
        if getattr(model, "is_gradient_checkpointing", False):
            with_offload = " with offload" if self.offload is not None else ""
            raise _zeroshard.Error(
                f"activation_checkpointing.mode '{self.mode}'{with_offload} and the model's own "
                "gradient checkpointing (gradient_checkpointing_enable()) both recompute its "
                "layers; allowed: one of the two (gradient_checkpointing_disable(), or mode "
                "none)")
        if self.mode not in ("memory_budget", "auto") or not torch.is_grad_enabled():
            return
        if told is not None and told == self.counted_at:
            return
        counted = self.counted() if self.counted is not None else None
        if counted is None:
            mode = "auto" if self.mode == "auto" else f"memory_budget ({self.budget})"
            raise _zeroshard.Error(
                f"activation_checkpointing.mode {mode}: the planner "
                f"cannot count this model's activations (a {type(model).__name__}: it "
                "reads a Hugging Face model whose family zeroshard-estimate knows, from "
                "model.config and the input_ids of a forward); allowed: mode full or selective")
        whole, self.counted_at = counted[0], told
        self.how = ["whole" if i < whole else None for i in range(len(self.how))]

    def forward(self, block, index, forward, args, kwargs):
        how = self.how[index]
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if how is None:
            if self.offload is None:
                return forward(*args, **kwargs)
            with self.offload.block(block):
                return forward(*args, **kwargs)
        kwargs = self._without_cache(block, kwargs)
        context = self.saved if how == "ops" else torch_checkpoint.noop_context_fn
        if self.offload is None:
            return torch_checkpoint.checkpoint(forward, *args, use_reentrant=False,
                                               context_fn=context, **kwargs)
        with self.offload.block(block):  # torch's checkpoint saves the input through the hooks
            return torch_checkpoint.checkpoint(forward, *args, use_reentrant=False,
                                               context_fn=context, **kwargs)

    def _without_cache(self, block, kwargs):
        """The block's keyword arguments with use_cache False and no cache to update, unless
        it only reads one (transformers' _can_checkpoint_with_cache)."""
        cleared = [] if getattr(block, "_can_checkpoint_with_cache", False) else [
            k for k in _CACHE_ARGUMENTS if kwargs.get(k) is not None]
        if kwargs.get("use_cache"):
            cleared.append("use_cache")
        if not cleared:
            return kwargs
        if not self.cache_warned:
            self.cache_warned = True
            print(f"zeroshard warning: activation_checkpointing.mode '{self.mode}': "
                  f"{type(block).__name__} runs without a key-value cache ({', '.join(cleared)} "
                  "cleared): a recomputed block would update it twice", flush=True)
        return dict(kwargs, **{k: False if k == "use_cache" else None for k in cleared})


def _recomputed_forward(self, *args, **kwargs):
    recompute, index, own = self._zeroshard_recompute
    forward = own if own is not None else types.MethodType(type(self).forward, self)
    return recompute.forward(self, index, forward, args, kwargs)


def _wrap(block, recompute, index):
    """The block's forward, run by `recompute`: an attribute of the block, so its hooks,
    parameters and names stay as they are (a copy of the model copies the binding). A
    block wrapped by an earlier engine keeps the forward it had before that one."""
    earlier = getattr(block, "_zeroshard_recompute", None)
    own = earlier[2] if earlier is not None else block.__dict__.get("forward")
    block._zeroshard_recompute = (recompute, index, own)
    block.forward = types.MethodType(_recomputed_forward, block)


def apply(engine, model, loaded, stages=1):
    """The config's activation_checkpointing.mode and offload applied to the model's blocks:
    a Recompute, or None for mode none without offload. `engine`: a weak reference to the
    ZeroShardEngine (None: no planner to count with, no store to offload to); `stages`: the
    pipeline stages the ranks run."""
    mode, option, budget = loaded.activation_policy
    device = loaded.activation_offload
    if mode == "none" and device == "none":
        return None
    if stages > 1:
        what = f"activation_checkpointing.mode '{mode}'" if mode != "none" else \
            f"activation_checkpointing.offload.device '{device}'"
        raise _zeroshard.Error(
            f"{what} with {stages} pipeline stages: not composed in zeroshard yet (a stage's "
            "layers recompute by the PipelineModule's activation_checkpoint_interval); "
            "allowed: mode none and offload none with pipeline stages")

    def counted():
        e = engine() if engine is not None else None
        return e._engine.recomputed_layers() if e is not None else None

    offload = None
    if device != "none":
        if engine is None or engine() is None:
            raise _zeroshard.Error("activation_checkpointing.offload: no engine to keep the "
                                   "activations with")
        offload = _offload.Offload(engine()._engine.activation_store())
    return Recompute(counted, model, mode, option, budget, offload)
