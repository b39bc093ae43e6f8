"""zeroshard.integrations.ZeroShardFabricStrategy: Lightning Fabric, with the model set up by
fabric.setup(model, optimizer) trained by zeroshard's engine:

    fabric = Fabric(strategy=ZeroShardFabricStrategy(stage=3))   # or "zeroshard_stage_3"

The script's loop is kept as written for DDP: fabric.backward(loss) is engine.backward,
optimizer.step() the engine's step; the engine reduces gradients once per accumulation
window, so fabric.no_backward_sync has nothing to skip. The window is the config's
gradient_accumulation_steps, which must be the script's (checked at every step). The
script scales each micro-batch's loss as it does for DDP (the gradients are then DDP's):
the engine, which averages over the window, gets the loss multiplied by the window's
length. fabric.clip_gradients(max_norm=...) names the config's gradient_clipping, which the
engine applies at its step. fabric.save/load write and read the engine's sharded checkpoint
(a folder), the script's other state inside it."""
import copy
import os
from contextlib import nullcontext

import torch
from lightning.fabric.plugins.precision import HalfPrecision, MixedPrecision, Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY, DDPStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.fabric.utilities.load import _move_state_into

from . import _lightning_common as _lightning
from .. import _zeroshard
from .._engine.construction import Init
from .._engine.engine import EngineModule
from .._engine.initialize import initialize
from .._parallel import placement as _placement


def _error(message):
    return _zeroshard.Error(f"ZeroShardFabricStrategy: {message}")


class ZeroShardFabricPrecision(Precision):
    """Fabric's precision flag, carried out by the engine (no autocast: its weights are in
    the compute dtype)."""

    def __init__(self, precision="32-true"):
        if precision not in _lightning.PRECISIONS:
            raise _error(f"precision {precision!r}; allowed: {', '.join(_lightning.PRECISIONS)}")
        self.precision = precision

    def convert_input(self, data):
        return _lightning.convert_input(data, self.precision)

    def forward_context(self):
        return nullcontext()


class _WindowAlreadyReduced(_BackwardSyncControl):
    def no_backward_sync(self, module, enabled):
        return nullcontext()  # the engine reduces once per accumulation window anyway


class ZeroShardFabricStrategy(DDPStrategy):
    """Fabric(strategy=ZeroShardFabricStrategy(config=..., stage=..., offload_optimizer=...,
    offload_parameters=...)). config: a path to YAML or JSON, or a dict, DeepSpeed's keys;
    default: the planner picks the stage."""

    def __init__(self, config=None, stage=None, offload_optimizer=False,
                 offload_parameters=False, offload_optimizer_device="cpu",
                 offload_params_device="cpu", nvme_path=None, accelerator=None,
                 parallel_devices=None, cluster_environment=None, checkpoint_io=None,
                 precision=None, process_group_backend=None, **timeout):
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision=precision, process_group_backend=process_group_backend,
                         **_lightning.only_timeout(timeout, "ZeroShardFabricStrategy"))
        self.config, self._origin = _lightning.strategy_config(
            config, stage, offload_optimizer, offload_parameters, offload_optimizer_device,
            offload_params_device, nvme_path)
        self._backward_sync_control = _WindowAlreadyReduced()
        self.engine = None
        self._backwards = 0  # since the last step

    @property
    def precision(self):
        return self._precision if self._precision is not None else ZeroShardFabricPrecision()

    @precision.setter
    def precision(self, plugin):
        if plugin is not None and not isinstance(plugin, ZeroShardFabricPrecision):
            plugin = ZeroShardFabricPrecision(_lightning.precision_of(
                plugin, (Precision, MixedPrecision, HalfPrecision), "ZeroShardFabricStrategy"))
        self._precision = plugin

    def setup_environment(self):
        super().setup_environment()
        _lightning.export_launch_env(self)

    def _engine_config(self):
        config = copy.deepcopy(self.config)
        _lightning.fill_precision(config, self.precision.precision, "Fabric(precision)",
                                  self._origin)
        return config

    def setup_module_and_optimizers(self, module, optimizers, scheduler=None):
        if len(optimizers) != 1:
            raise _error(f"fabric.setup got {len(optimizers)} optimizers; allowed: one (one "
                         "engine steps one optimizer)")
        return self._start(module, optimizers[0]), optimizers, scheduler

    def setup_module(self, module):
        return self._start(module, None)

    def setup_optimizer(self, optimizer):
        raise _error("fabric.setup_optimizers(...): the engine takes the optimizer with its "
                     "model; allowed: fabric.setup(model, optimizer)")

    def _start(self, module, optimizer):
        if self.engine is not None:
            raise _error("a second model set up; allowed: one model per strategy (one engine)")
        with _placement.chosen(self.root_device):  # where Fabric puts the batches
            self.engine = initialize(model=module, config=self._engine_config(),
                                     optimizer=optimizer)[0]
        return EngineModule(self.engine)

    def module_to_device(self, module):
        pass  # initialize places the parameters (_parallel/placement.py)

    def module_sharded_context(self):
        return Init(config=self.config)

    def module_init_context(self, empty_init=None):
        return self.module_sharded_context()

    def backward(self, tensor, module, *args, **kwargs):
        if args:
            raise _error("fabric.backward(): positional arguments are not taken by the engine")
        retain = kwargs.pop("retain_graph", False)
        if kwargs:
            raise _error(f"fabric.backward(): {', '.join(sorted(kwargs))} not allowed; allowed: "
                         "retain_graph")
        window = self.engine.gradient_accumulation_steps()
        if self._backwards == window:
            raise _error(
                f"fabric.backward() called more than {window} time(s) since the last "
                f"optimizer.step(), and the config's gradient_accumulation_steps is {window}: "
                "allowed: that setting equal to the script's accumulation")
        self.engine.backward(tensor * window if window != 1 else tensor, retain_graph=retain)
        self._backwards += 1

    def optimizer_step(self, optimizer, **kwargs):
        if kwargs:
            raise _error(f"optimizer.step(): {', '.join(sorted(kwargs))} not allowed; the "
                         "engine steps without a closure")
        window = self.engine.gradient_accumulation_steps()
        if self._backwards != window:
            raise _error(
                f"optimizer.step() after {self._backwards} fabric.backward() calls, and the "
                f"config's gradient_accumulation_steps is {window}: allowed: that setting equal "
                "to the script's accumulation")
        self._backwards = 0
        stepped = self.engine.step()
        optimizer._opt_called = True  # what a scheduler checks its optimizer stepped by
        return stepped

    def clip_gradients_norm(self, module, optimizer, max_norm, norm_type=2.0,
                            error_if_nonfinite=True):
        """The engine clips the global 2-norm at its step to the config's gradient_clipping;
        returns the norm of the last step's gradients (before clipping), as accelerate's
        DeepSpeed path does."""
        configured = self.engine.gradient_clipping()
        if norm_type != 2 or float(max_norm) != configured:
            raise _error(
                f"clip_gradients(max_norm={max_norm}, norm_type={norm_type:g}): the engine clips "
                f"the global 2-norm at its step to the config's gradient_clipping ({configured}); "
                f"allowed: max_norm={configured}, or the config with gradient_clipping: {max_norm}")
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else torch.tensor(norm)

    def clip_gradients_value(self, module, optimizer, clip_val):
        raise _error("clip_gradients(clip_val=...): the engine clips by the global norm; "
                     "allowed: max_norm equal to the config's gradient_clipping")

    def get_module_state_dict(self, module):
        if isinstance(module, EngineModule):
            return module.engine.state_dict()  # whole, on every rank (a collective)
        return super().get_module_state_dict(module)

    def _engine_in(self, state):
        engines = [v for v in (state or {}).values() if isinstance(v, EngineModule)]
        if len(engines) != 1 or engines[0].engine is not self.engine:
            raise _error(f"the state holds {len(engines)} models set up by this strategy; "
                         "allowed: exactly its one, as {'model': model, ...}")
        return self.engine

    def save_checkpoint(self, path, state, storage_options=None, filter=None):
        """A collective: every rank writes its shards to the folder `path`."""
        if storage_options is not None or filter is not None:
            raise _error("fabric.save(..., storage_options/filter): not taken (the engine "
                         "writes the checkpoint itself)")
        engine = self._engine_in(state)
        rest = {k: v for k, v in state.items()
                if not isinstance(v, (EngineModule, torch.optim.Optimizer))}
        rest = self._convert_stateful_objects_in_state(rest, filter={})
        text = _lightning.encode_state(rest, "ZeroShardFabricStrategy.save_checkpoint: the state")
        path = self.broadcast(os.fspath(path))
        os.makedirs(path, exist_ok=True)
        engine.save_checkpoint(path, tag="checkpoint", client_state={"fabric": text})

    def load_checkpoint(self, path, state=None, strict=True, weights_only=None):
        if not isinstance(state, dict):
            raise _error("fabric.load(path, state): state must be a dict holding the model "
                         "(and the optimizer, to restore its state)")
        engine = self._engine_in(state)
        path = _lightning.check_checkpoint_folder(path)
        with_optimizer = any(isinstance(v, torch.optim.Optimizer) for v in state.values())
        _, client = engine.load_checkpoint(path, load_optimizer_states=with_optimizer,
                                           load_lr_scheduler_states=False,
                                           load_module_strict=strict)
        if not client or "fabric" not in client:
            raise _error(f"checkpoint '{path}' holds no Fabric state (saved by another front-end); "
                         "load it with engine.load_checkpoint")
        rest = _lightning.decode_state(client["fabric"], weights_only, path)
        wanted = {k for k, v in state.items()
                  if not isinstance(v, (EngineModule, torch.optim.Optimizer))}
        missing = wanted - set(rest)
        if strict and missing:
            raise _error(f"the state asks for {sorted(missing)}, which the checkpoint does not "
                         "hold; allowed: strict=False")
        _move_state_into(source=rest, destination=state, keys=wanted)
        return rest

    @classmethod
    def register_strategies(cls, registry):
        for name, description, kwargs in _lightning.NAMES:
            if name not in registry:
                registry.register(name, cls, description=description, **kwargs)


ZeroShardFabricStrategy.register_strategies(STRATEGY_REGISTRY)
