"""ZeroShardEngine: wraps an ordinary torch.nn.Module. Parameters are flattened and
sharded by the C++ Engine; at stage 3 each unit's parameters are gathered by forward
pre-hooks, freed by forward hooks, and gathered again when the gradient of the unit's
output arrives in backward."""
import contextlib
import weakref

import torch

from . import (adafactor as _adafactor, construction as _construction, generation as _generation,
               torch_optimizer as _torch_optimizer)
from .._experts import (dtensor_experts as _dtensor_experts, expert_parallel as _expert_parallel,
                        expert_state as _expert_state, hf_expert_parallel as _hf_expert_parallel)
from .._parallel import (dtensor as _dtensor, hf_tensor_parallel as _hf_tensor_parallel,
                         placement as _placement, sync_batchnorm as _sync_batchnorm,
                         tensor_parallel as _tensor_parallel)
from .._sequence import context_parallel as _context_parallel, sequence_groups as _sequence_groups
from .accessors import EngineAccessors
from .parallel_sizes import ParallelSizes
from .. import _zeroshard
from .._common import config as _config, launch as _launch, process_groups as _process_groups
from .._common.nested import tensors
from .._activations.shapes import ActivationShape, assumed_batch, say_offload_ratio
from .._activations import policy as _recompute_policy
from .touch import Units, shard_parameters
from .unit_backward import GradArrival, report_input_grads
from .units import quantizable_names, stage3_units, unique_parameters
from .optimizer import (HYPER_KEYS, ZeroShardOptimizer, client_scheduler, engine_options,
                        parameter_groups, refuse_twice_named)
from .saving import SavingMethods
from .dataloader import LoaderMethods


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


def _buffers(model):
    """(name, tensor, persistent) for every buffer, once each (the first name of one a
    shared module registers)."""
    seen, out = set(), []
    for prefix, mod in _all_modules(model):
        dot = prefix + "." if prefix else ""
        for name, b in mod._buffers.items():
            if b is not None and id(b) not in seen:
                seen.add(id(b))
                out.append((dot + name, b, name not in mod._non_persistent_buffers_set))
    return out


def _all_modules(model, prefix=""):
    """Every (name, module), a module shared by two parents under both names."""
    yield prefix, model
    for name, child in model._modules.items():
        if child is not None:
            yield from _all_modules(child, prefix + ("." if prefix else "") + name)


# id(parameter) -> (weakref to it, weakref to the engine that trains it); by id because
# tensors compare by value. An entry goes when its parameter does (_hold).
_holders = {}


def _hold(param, engine_ref):
    key = id(param)

    def forget(ref):  # runs before the id can be reused; a newer entry for it stays
        held = _holders.get(key)
        if held is not None and held[0] is ref:
            del _holders[key]

    _holders[key] = (weakref.ref(param, forget), engine_ref)


def engine_of(param):
    """The live engine that trains `param`, or None (zeroshard.zero.GatheredParameters)."""
    held = _holders.get(id(param))
    return held[1]() if held is not None and held[0]() is param else None


class EngineModule(torch.nn.Module):
    """What a Trainer's or an Accelerator's loop calls: the model, through the engine's hooks
    (stage 3 gathers each unit as it runs). Not a DDP or FSDP wrapper, so accelerate leaves
    it."""

    def __init__(self, engine):
        super().__init__()
        self.module = engine.module
        self.engine = engine

    def forward(self, *args, **kwargs):
        return self.engine(*args, **kwargs)


class ZeroShardEngine(SavingMethods, LoaderMethods, ParallelSizes, EngineAccessors):
    def __init__(self, model, config, units=None, model_parameters=None, optimizer=None,
                 lr_scheduler=None, mpu=None, mesh=None, weight_sources=None):
        _launch.require_launch_env()
        _launch.quiet_at_exit()
        if not isinstance(model, torch.nn.Module):
            raise _zeroshard.Error(f"model: a {type(model).__name__}; allowed: a torch.nn.Module")
        loaded = _config.parse(config)  # the one parse of this engine's config
        refuse_twice_named(loaded, optimizer, lr_scheduler)
        _process_groups.set_timeout(loaded.comm_timeout_seconds)  # groups made before too
        self.module = model
        placeholders_on = _placement.place(model)  # this rank's GPU, as DeepSpeed's engine
        # A model split by its own tp_plan (autotp_size); DTensor parameters as local tensors.
        places = _dtensor.places(model)
        autoep_size = _hf_expert_parallel.apply(model, loaded)  # experts split by AutoEP
        cp_size, mesh = _context_parallel.of_mesh(mesh, loaded) if mesh is not None else (0, None)
        mesh_ep, mesh, install_experts = _dtensor_experts.unwrap(model, mesh)  # DTensor experts
        if mesh_ep and autoep_size:
            raise _zeroshard.Error(
                f"zeroshard.initialize: the mesh's ep dimension ({mesh_ep} ranks) and the "
                f"config's expert_parallel (autoep_size {autoep_size}); allowed: one of the two")
        autoep_size = autoep_size or mesh_ep
        sp_size, mpu = _sequence_groups.of_mpu(mpu)
        if cp_size and sp_size:
            raise _zeroshard.Error(
                "zeroshard.initialize: the mesh has a cp dimension and the mpu sequence-parallel "
                "groups; allowed: one of the two")
        sp_size = sp_size or cp_size  # a cp group's ranks count as a sequence-parallel group's
        mesh, local_when, mpu = _hf_tensor_parallel.split_by_plan(model, loaded, mpu, mesh)
        tp_size, tp_params, install_dtensors = _dtensor.unwrap(model, mesh, local_when)
        if tp_size or autoep_size > 1:  # a client optimizer built over the replaced ones
            model_parameters = _dtensor.retarget(optimizer, model_parameters, places)
        del places  # its weak references would stop torch.utils.swap_tensors (_construction)
        if tp_size and mpu is not None:
            raise _zeroshard.Error(
                "zeroshard.initialize: mpu is given and the model's parameters are DTensors; "
                "allowed: one of the two (the DTensors' mesh says how the ranks are split)")
        self._units = stage3_units(model, units)  # [(modules, params)], every parameter
        client, groups, decoupled = parameter_groups(model, model_parameters, optimizer)
        if client is None:  # the config may name a torch.optim class
            client = _torch_optimizer.from_config(loaded, groups)
            if client is not None:
                groups, decoupled = client.param_groups, [None] * len(client.param_groups)
        torch_stepped = client is not None and not _torch_optimizer.is_builtin(client)
        keys = ("lr",) if torch_stepped else HYPER_KEYS
        params = unique_parameters(model)
        if not tp_size:
            tp_size, tp_params = _tensor_parallel.plan_of(mpu, params)
        unit_params = [ps for _, ps in self._units]
        engine_groups = [(list(g["params"]), engine_options(g, d, keys))
                         for g, d in zip(groups, decoupled)]
        # Parameters built sharded (zeroshard.init) or on the meta device come whole one
        # group at a time, as the engine copies them.
        materialize = _construction.materializer_for(model, weight_sources, placeholders_on)
        _sync_batchnorm.take_over(model)  # before the engine: it may start torch.distributed
        if _generation.syncs(model, loaded):
            _launch.init_distributed()  # generate's synced_gpus all-reduces through it
        ep_size, expert_names = _expert_parallel.expert_parameters(model, params, autoep_size)
        stepped_by = {"pipeline_parallel_size": _tensor_parallel.stages_of(mpu),
                      "sequence_parallel_size": sp_size,
                      "quantizable_params": quantizable_names(model, params),
                      "expert_parallel_size": ep_size, "expert_params": expert_names,
                      "ring_attention": bool(cp_size)}
        if torch_stepped:
            adafactor = _adafactor.is_adafactor(client)
            if adafactor and ep_size > 1:
                raise _zeroshard.Error(
                    f"expert parallelism (the MoE layers' ep_size {ep_size}) with Adafactor "
                    "(its factored state sums rows and columns over every shard): not composed "
                    "in zeroshard yet; allowed: an elementwise optimizer (Adam, AdamW, SGD, ...), "
                    "or ep_size 1")
            _tensor_parallel.check_optimizer(tp_size, "Adafactor" if adafactor else "")
            stepped_by.update(
                optimizer_type=type(client).__name__, optimizer_elementwise=not adafactor,
                optimizer_state_bytes=_torch_optimizer.state_bytes_per_element(client))
            if adafactor:
                per_element, whole, sharded = _adafactor.state_footprint(client)
                stepped_by.update(optimizer_state_bytes=per_element,
                                  optimizer_state_other=(whole, sharded))
        self._engine = _zeroshard.Engine(params, unit_params, loaded, engine_groups,
                                         _launch.store_already_served(), materialize,
                                         _buffers(model), assumed_batch=assumed_batch(model),
                                         tensor_parallel_size=tp_size,
                                         tensor_parallel_params=tp_params, **stepped_by)
        self._engine.set_aliases(_aliases(model))
        say_offload_ratio(self._engine)
        self._torch_optimizer = None  # a torch.optim class on the shards, when it is one
        if torch_stepped:
            self._torch_optimizer = (
                _adafactor.ShardedAdafactor(self._engine, client, params)
                if _adafactor.is_adafactor(client)
                else _torch_optimizer.TorchShardOptimizer(self._engine, client))
            self._engine.set_optimizer_hooks(self._torch_optimizer)
        self.optimizer = ZeroShardOptimizer(self._engine, self.zero_grad, groups, decoupled, keys)
        # A client scheduler, stepped after each optimizer step as DeepSpeed does.
        self.lr_scheduler = client_scheduler(lr_scheduler, self.optimizer, client)
        self._scheduled = self._engine.scheduled  # a config scheduler sets every lr
        if self._scheduled:
            self.optimizer.show_scheduled_lr()
        self._pending_backward = False
        self.training_dataloader, self.collate_fn = None, None  # initialize's training_data
        self._hooks = []
        self._running = None
        if self._engine.shards_parameters:
            self._hook_stage3(model)
            _generation.sync_generate(model, self._engine.world_size)
        me = weakref.ref(self)
        self._recompute = _recompute_policy.apply(me, model, loaded, max(
            loaded.pipeline_parallel_size, stepped_by["pipeline_parallel_size"] or 1))
        self._same_inputs = _tensor_parallel.SameInputs(tp_size) if tp_size > 1 else None
        self._tensor_parallel_split = tp_params  # {name: dimension} of the split parameters
        self._expert_parallel_size = ep_size
        if ep_size > 1:  # the names checkpoints keep the split experts under
            self._engine.set_expert_names(*_expert_state.saved_names(model, expert_names))
        self._hook_model(model)
        for install in (install_dtensors, install_experts):  # after the units' hooks: a
            if install:  # unit is gathered before it runs
                self._hooks += install()
        self._step_applied = False
        for _, p in params:
            _hold(p, me)

    def _hook_model(self, model):
        """The model's own forward: buffers made equal across ranks where one begins
        (engine/ModuleBuffers.h), and at stage 3 the bounds of one forward's gathers."""
        engine, units, same_inputs = self._engine, self._running, self._same_inputs
        recompute = self._recompute
        activations = ActivationShape(engine, model, engine.sequence_parallel_size)
        depth = [0]  # a call inside its own call (Lightning's training_step) is the outer one's

        def model_begins(_module, args, kwargs):
            depth[0] += 1
            if depth[0] > 1:
                return
            if same_inputs is not None and torch.is_grad_enabled():
                same_inputs.check(args, kwargs)
            if units is not None:
                units.running[:] = [0] * len(units.running)  # a forward that raised left some
            engine.model_forward_begin()
            activations.observe(args, kwargs)
            if recompute is not None:
                recompute.begin_forward(activations.told)

        def model_ends(_module, _inputs, _output):
            if depth[0] == 1:
                engine.model_forward_end(torch.is_grad_enabled())

        def model_left(_module, _inputs, _output):  # also when the forward (or a hook) raised
            depth[0] = max(depth[0] - 1, 0)

        # First before the forward and last after it, also where the model is a unit itself.
        self._hooks += [
            model.register_forward_pre_hook(model_begins, prepend=True, with_kwargs=True),
            model.register_forward_hook(model_ends),
            model.register_forward_hook(model_left, always_call=True)]

    def _hook_stage3(self, model):
        """Every unit gathered where one of its modules runs, and wherever else one of its
        parameters is read (zeroshard/_touch.py)."""
        self._running = Units(self._engine, len(self._units))
        shard_parameters(self._running, self._units)
        for index, (modules, _) in enumerate(self._units):
            for module in modules:
                self._hook_unit(index, module)

    def _hook_unit(self, index, unit):
        engine, running = self._engine, self._running.running

        def before(_module, args, kwargs):
            engine.unit_forward_begin(index)
            running[index] += 1
            if torch.is_grad_enabled():
                report_input_grads(engine, index, args, kwargs)

        def after(_module, args, kwargs, output):
            # Backward reaches the unit when a gradient of what it made arrives. A tensor
            # it was given and hands on (T5's position bias) is not what it made: its
            # gradient is complete only after every later block, long after this one.
            if torch.is_grad_enabled():
                given = {id(t) for t in tensors((args, kwargs))}
                for t in tensors(output):
                    if t.requires_grad and id(t) not in given:
                        GradArrival.of(t).produced_by.append(
                            lambda: engine.unit_backward_begin(index))
            running[index] -= 1
            engine.unit_forward_end(index)

        self._hooks.append(unit.register_forward_pre_hook(before, with_kwargs=True))
        self._hooks.append(unit.register_forward_hook(after, with_kwargs=True))

    # DeepSpeed's engine surface
    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    forward = __call__

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """One micro-batch's backward (DeepSpeed's keywords: retain_graph keeps autograd's
        graph for another pass through it)."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise _zeroshard.Error("engine.backward(loss): loss must be a one-element tensor")
        if not scale_wrt_gas:
            raise _zeroshard.Error(
                "engine.backward(loss, scale_wrt_gas=False): not supported; allowed: True (the "
                "step takes the mean over the accumulation window's micro-batches; to sum "
                "them instead, multiply the loss by gradient_accumulation_steps)")
        if self.sequence_parallel_size > 1:
            scale = _sequence_groups.replicated_loss_scale(loss, self.get_sequence_parallel_group())
            loss = loss * scale if scale != 1.0 else loss
        self._engine.backward(loss, retain_graph=bool(retain_graph))
        self._pending_backward = True

    def step(self, lr_kwargs=None):
        """Steps the optimizer at each gradient-accumulation boundary; True when it did.
        lr_kwargs go to the client LR scheduler's step() (DeepSpeed's keyword)."""
        if not self._pending_backward:
            raise _zeroshard.Error(
                "engine.step() called before engine.backward(loss): there are no gradients "
                "to step with; call engine.backward(loss) after each forward")
        if lr_kwargs and self.lr_scheduler is None:
            raise _zeroshard.Error(
                f"engine.step(lr_kwargs={lr_kwargs!r}): there is no client LR scheduler to "
                "take them (a config scheduler follows the step count); allowed: None, or pass "
                "lr_scheduler= to initialize()")
        boundary = self.is_gradient_accumulation_boundary()
        self._pending_backward = False
        self.optimizer.push_groups()
        stepped = self._engine.step()
        if boundary:
            self._step_applied = stepped
        if stepped and self._scheduled:
            self.optimizer.show_scheduled_lr()
        if stepped and self.lr_scheduler is not None:
            # torch's schedulers warn unless their optimizer's step() ran first; here the
            # engine stepped it.
            bound = getattr(self.lr_scheduler, "optimizer", None)
            if bound is not None:
                bound._opt_called = True
            self.lr_scheduler.step(**(lr_kwargs or {}))
        return stepped

    def zero_grad(self):
        self._engine.zero_grad()

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def memory_report(self):
        """{tier: {"current", "peak", "predicted", "kinds": {kind: {current, peak,
        predicted}}}} in bytes, this rank. The "device" tier also has "capacity" (the bytes
        the plan was made for) and, for a model on a GPU, "allocator": the CUDA caching
        allocator's "allocated", "peak_allocated" and "peak_reserved" (torch.cuda's
        memory_allocated, max_memory_allocated, max_memory_reserved), which count
        activations too."""
        return self._engine.memory_report()

    @contextlib.contextmanager
    def gathered_parameters(self, module=None, modifier_rank=None):
        """Full parameters of the stage-3 units holding `module`'s parameters (all units
        when None) while inside the block, to read them outside forward, or to write them
        (initialisation, tying): with modifier_rank=R, rank R's values when the block ends
        become every rank's, sharded again, and the optimizer's fp32 master restarts from
        them (DeepSpeed's GatheredParameters). A collective: every rank enters it for the
        same module."""
        with self.gathered(list((module or self.module).parameters()), modifier_rank):
            yield

    @contextlib.contextmanager
    def gathered(self, params, modifier_rank=None):
        """gathered_parameters for a list of parameters (zeroshard.zero.GatheredParameters)."""
        wanted = {id(p) for p in params}
        indices = [i for i, (_, ps) in enumerate(self._units)
                   if any(id(p) in wanted for _, p in ps)]
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
