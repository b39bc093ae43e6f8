"""ZeroShardEngine: wraps an ordinary torch.nn.Module. Parameters are flattened and
sharded by the C++ Engine; at stage 3 each unit's parameters are gathered by forward
pre-hooks, freed by forward hooks, and gathered again when the gradient of the unit's
output arrives in backward."""
import contextlib
import json
import os

import torch

from . import _zeroshard
from .config import load_config

_LAUNCH_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def _require_launch_env():
    if any(v in os.environ for v in _LAUNCH_VARS):
        return
    raise _zeroshard.Error(
        "zeroshard.initialize: no process-group environment (none of RANK from torchrun, "
        "SLURM_PROCID from srun, OMPI_COMM_WORLD_RANK from mpirun is set); start the script "
        "with `torchrun --nproc_per_node N script.py`, `./zs run -n N script.py`, srun or "
        "mpirun, or for one process set RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "
        "MASTER_PORT=29500")


def _unique_params(module):
    seen, out = set(), []
    for name, p in module.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def _aliases(model):
    """(name, first name) for every parameter reachable under a second name (tied)."""
    first, out = {}, []
    for prefix, mod in _all_modules(model):
        dot = prefix + "." if prefix else ""
        for name, p in mod._parameters.items():
            if p is None:
                continue
            full = dot + name
            if id(p) not in first:
                first[id(p)] = full
            elif first[id(p)] != full:
                out.append((full, first[id(p)]))
    return out


def _all_modules(model, prefix=""):
    """Every (name, module), a module shared by two parents under both names."""
    yield prefix, model
    for name, child in model._modules.items():
        if child is not None:
            yield from _all_modules(child, prefix + ("." if prefix else "") + name)


def default_units(model):
    """The blocks of the model's largest ModuleList (by parameter count), FSDP-style."""
    best, best_count = None, -1
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList):
            count = sum(p.numel() for p in m.parameters())
            if count > best_count:
                best, best_count = m, count
    return list(best) if best is not None else []


def _resolve_units(model, units):
    if units is None:
        return default_units(model)
    by_name = dict(model.named_modules())
    out = []
    for u in units:
        if isinstance(u, str):
            if u not in by_name:
                raise _zeroshard.Error(
                    f"units: '{u}' is not a submodule of the model; allowed: names from "
                    "model.named_modules() or module objects")
            u = by_name[u]
        out.append(u)
    return out


class ZeroShardEngine:
    def __init__(self, model, config, units=None):
        _require_launch_env()
        if not isinstance(model, torch.nn.Module):
            raise _zeroshard.Error(f"model: a {type(model).__name__}; allowed: a torch.nn.Module")
        text, origin = load_config(config)
        self.module = model
        self._units = _resolve_units(model, units)
        params = _unique_params(model)
        unit_params = [_unique_params(u) for u in self._units]
        self._engine = _zeroshard.Engine(params, unit_params, text, origin)
        self._engine.set_aliases(_aliases(model))
        self._pending_backward = False
        self._hooks = []
        if self._engine.stage == 3:
            for index, unit in enumerate(self._units):
                self._hook_unit(index, unit)

    def _hook_unit(self, index, unit):
        engine = self._engine

        def before(_module, _inputs):
            engine.unit_forward_begin(index)

        def after(_module, _inputs, output):
            if torch.is_grad_enabled():
                for t in _tensors(output):
                    if t.requires_grad:
                        t.register_hook(lambda _grad: engine.unit_backward_begin(index))
            engine.unit_forward_end(index)

        self._hooks.append(unit.register_forward_pre_hook(before))
        self._hooks.append(unit.register_forward_hook(after))

    # DeepSpeed's engine surface
    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    forward = __call__

    def backward(self, loss):
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise _zeroshard.Error("engine.backward(loss): loss must be a one-element tensor")
        self._engine.backward(loss)
        self._pending_backward = True

    def step(self):
        """Steps the optimizer at each gradient-accumulation boundary; True when it did."""
        if not self._pending_backward:
            raise _zeroshard.Error(
                "engine.step() called before engine.backward(loss): there are no gradients "
                "to step with; call engine.backward(loss) after each forward")
        self._pending_backward = False
        return self._engine.step()

    def zero_grad(self):
        self._engine.zero_grad()

    def get_lr(self):
        return [self._engine.lr]

    @property
    def loss_scale(self):
        return self._engine.loss_scale

    @property
    def global_grad_norm(self):
        return self._engine.global_grad_norm

    @property
    def global_steps(self):
        return self._engine.optimizer_steps

    @property
    def rank(self):
        return self._engine.rank

    @property
    def world_size(self):
        return self._engine.world_size

    @property
    def zero_stage(self):
        return self._engine.stage

    @property
    def plan(self):
        return self._engine.plan_label

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def memory_report(self):
        """{tier: {kind: {current, peak, predicted}}} in bytes, this rank."""
        return self._engine.memory_report()

    def full_parameters(self):
        """Whole copies of every parameter (a collective at stage 3: call on every rank)."""
        return dict(self._engine.full_parameters())

    def state_dict(self):
        """An ordinary state_dict (full tensors, tied parameters under every name)."""
        full = self.full_parameters()
        by_id = {id(p): full[n] for n, p in _unique_params(self.module)}
        out = {}
        for prefix, mod in self.module.named_modules():
            dot = prefix + "." if prefix else ""
            for name, p in mod._parameters.items():
                if p is not None:
                    out[dot + name] = by_id[id(p)]
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent_buffers_set:
                    out[dot + name] = b.detach().clone()
        return out

    def save_checkpoint(self, save_dir, tag=None, client_state=None):
        """Each rank writes its shards to save_dir/tag, rank 0 the manifest; save_dir/latest
        moves last. client_state must be plain data (JSON). A collective. Returns the tag."""
        try:
            text = json.dumps(client_state or {})
        except TypeError as e:
            raise _zeroshard.Error(f"client_state must be plain data (JSON): {e}") from None
        return self._engine.save_checkpoint(os.fspath(save_dir), tag or "", text)

    def load_checkpoint(self, load_dir, tag=None):
        """Loads load_dir/tag (default: load_dir/latest), saved at any world size and stage.
        Returns (path, client_state) as DeepSpeed does."""
        state = self._engine.load_checkpoint(os.fspath(load_dir), tag or "")
        return os.path.join(os.fspath(load_dir), tag or "latest"), json.loads(state)

    @contextlib.contextmanager
    def gathered_parameters(self, module=None, modifier_rank=None):
        """Full parameters of the stage-3 units holding `module`'s parameters (all units
        when None) while inside the block, to read them outside forward, or to write them
        (initialisation, tying): with modifier_rank=R, rank R's values when the block ends
        become every rank's, sharded again, and the optimizer's fp32 master restarts from
        them (DeepSpeed's GatheredParameters). A collective: every rank enters it for the
        same module."""
        wanted = {id(p) for p in (module or self.module).parameters()}
        indices = [i for i, u in enumerate(self._units)
                   if any(id(p) in wanted for p in u.parameters())]
        for i in indices:
            self._engine.gather_unit(i)
        try:
            with torch.no_grad():
                yield
            if modifier_rank is not None:
                self._engine.commit_parameters(modifier_rank)
        finally:
            for i in indices:
                self._engine.release_unit(i)


def _tensors(output):
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for o in output:
            yield from _tensors(o)
    elif isinstance(output, dict):
        for o in output.values():
            yield from _tensors(o)


class _OptimizerView:
    """What initialize() returns as the optimizer: stepping belongs to the engine."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def param_groups(self):
        return [{"lr": self._engine.get_lr()[0], "params": list(self._engine.module.parameters())}]

    def step(self):
        raise _zeroshard.Error("call engine.step(), not optimizer.step(): the engine steps the "
                               "sharded optimizer at each accumulation boundary")

    def zero_grad(self, set_to_none=True):
        self._engine.zero_grad()


class _SchedulerView:
    """The config's scheduler (WarmupLR, WarmupDecayLR, WarmupCosineLR), stepped by the engine."""

    def __init__(self, engine):
        self._engine = engine

    def get_last_lr(self):
        return self._engine.get_lr()

    def step(self):
        pass  # the engine advances it with each optimizer step


def initialize(model=None, config=None, model_parameters=None, training_data=None,
               units=None, args=None, **_):
    """deepspeed.initialize's shape: returns (engine, optimizer, dataloader, scheduler).
    `units`: stage-3 units (modules or their names); default the blocks of the model's
    largest ModuleList. model_parameters is accepted for compatibility; every parameter
    of the model is trained (requires_grad=False ones are kept frozen)."""
    if model is None:
        raise _zeroshard.Error("zeroshard.initialize: model is required")
    if config is None:
        config = getattr(args, "deepspeed_config", None)
    if config is None:
        raise _zeroshard.Error("zeroshard.initialize: config is required (a path or a dict)")
    engine = ZeroShardEngine(model, config, units=units)
    loader = None
    if training_data is not None:
        sampler = torch.utils.data.distributed.DistributedSampler(
            training_data, num_replicas=engine.world_size, rank=engine.rank)
        loader = torch.utils.data.DataLoader(training_data,
                                             batch_size=engine._engine.micro_batch_size,
                                             sampler=sampler)
    return engine, _OptimizerView(engine), loader, _SchedulerView(engine)
