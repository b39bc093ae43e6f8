"""zeroshard.integrations.Accelerator: accelerate's Accelerator, with the model and its
optimizer trained by zeroshard's engine. An accelerate script switches with one import:

    from zeroshard.integrations import Accelerator

accelerate has no plug-in point for another sharding backend (its DistributedType is a
closed set), so this is a subclass: everything but the model and optimizer stays
accelerate's own (the process group, the data loaders' sharding, accumulate(),
gather_for_metrics, the scheduler's stepping), as it stays under accelerate's DeepSpeed
path, which this follows:
- prepare() starts the engine over the model and the client optimizer (initialize), and
  returns the model through the engine's hooks and an optimizer whose step() is the
  engine's (it steps at the accumulation boundary, clipping included) and whose
  zero_grad() is left to the engine.
- backward(loss) is engine.backward(loss), which averages over the accumulation window
  and the data-parallel ranks itself; accumulate() keeps the Accelerator's count of
  micro-batches, which the engine's boundary follows.
- The config (DeepSpeed's keys, `zeroshard_config=`) takes the Accelerator's
  gradient_accumulation_steps and mixed_precision and the data loaders' batch size where
  it leaves them out (or `auto`); a value that contradicts them is an error naming both.
  Clipping is the config's gradient_clipping: clip_grad_norm_ checks that its max_norm is
  that value and returns the engine's last global norm, as accelerate does for DeepSpeed.
- parallelism_config: ParallelismConfig(sp_backend='deepspeed', sp_size=N) is ALST's path
  as accelerate's DeepSpeed path takes it (Ulysses registered with transformers for the
  model, the mpu and sequence_parallel_size for the engine, the data loaders of the model's
  prepare() call adapted); ParallelismConfig(cp_size=N) is torch's ring attention as its
  FSDP2 path takes it (_context_parallel.py: accelerate's mesh to the engine, its
  maybe_context_parallel, the loss weighted as FSDP2 weighs it); tp_size is refused by name.
- save_state/load_state keep accelerate's folder (schedulers, samplers, RNG states,
  registered objects) with the engine's sharded checkpoint inside, as accelerate's DeepSpeed
  path keeps DeepSpeed's."""
import contextlib
import os

import accelerate
import torch

from .._common import config as _config
from .. import _zeroshard
from .._engine.engine import EngineModule
from .._engine.initialize import initialize
from .._parallel import placement as _placement
from . import _context_parallel, _ulysses

# accelerate's other sharding and parallelism back ends: each would shard the model itself.
_OTHER_BACKENDS = ("deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin", "torch_tp_plugin")


ENGINE_TAG = "zeroshard"  # the engine's checkpoint inside save_state's folder


def _placed_on(model):
    """Where the script left the model: its first parameter's device."""
    return next(model.parameters()).device


def _error(message):
    return _zeroshard.Error(f"zeroshard Accelerator: {message}")


class _EngineOptimizer(torch.optim.Optimizer):
    """The client optimizer as the script holds it after prepare(): its param_groups (a
    scheduler sets their lr, which the engine reads), with step() the engine's."""

    def __init__(self, engine, optimizer, accelerator):  # the base's __init__ is not called
        self.engine, self.optimizer, self.accelerator = engine, optimizer, accelerator
        self.step_was_skipped = False  # read by accelerate's AcceleratedScheduler

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def step(self, closure=None):
        if closure is not None:
            raise _error("optimizer.step(closure): the engine steps without a closure")
        # The engine ends a window every gradient_accumulation_steps micro-batches; accelerate
        # also ends one at the end of a data loader (sync_with_dataloader), which the engine
        # cannot: said, not stepped at different times.
        sync, boundary = self.accelerator.sync_gradients, self.engine.is_gradient_accumulation_boundary()
        if sync != boundary:
            raise _error(
                f"accelerate {'ends' if sync else 'does not end'} the accumulation window at this "
                f"micro-batch and the engine {'does' if boundary else 'does not'} (every "
                f"{self.engine.gradient_accumulation_steps()} micro-batches); a data loader whose "
                "length is not a multiple of gradient_accumulation_steps ends one early: allowed: "
                "such a length (drop_last, or a batch count that divides), or "
                "GradientAccumulationPlugin(sync_with_dataloader=False)")
        skipped_before = self.engine.skipped_steps
        self.engine.step()
        self.step_was_skipped = self.engine.skipped_steps != skipped_before
        self.optimizer._opt_called = True  # what a scheduler checks its optimizer stepped by

    def zero_grad(self, set_to_none=True):
        """The engine clears its gradient buffers after each step."""

    def state_dict(self):
        raise _error("optimizer.state_dict(): the optimizer's state is sharded across ranks; "
                     "save it with engine.save_checkpoint (accelerator.zeroshard_engine)")

    def load_state_dict(self, state_dict):
        raise _error("optimizer.load_state_dict(): load a sharded checkpoint with "
                     "engine.load_checkpoint (accelerator.zeroshard_engine)")

    def __repr__(self):
        return f"zeroshard engine over {self.optimizer!r}"


class Accelerator(accelerate.Accelerator):
    """accelerate.Accelerator(...) with `zeroshard_config` (a path to YAML or JSON, or a
    dict, DeepSpeed's keys; default: the planner picks the stage)."""

    def __init__(self, *args, zeroshard_config=None, **kwargs):
        for name in _OTHER_BACKENDS:
            if kwargs.get(name) is not None:
                raise _error(f"{name} is given; zeroshard does the sharding here: leave it out "
                             "and give the config as zeroshard_config (DeepSpeed's keys)")
        # Kept from accelerate's own checks, which take it for FSDP2, DeepSpeed or GPUs only
        # (not CPU ranks); its DeepSpeed sequence parallelism builds no mesh either.
        parallelism = kwargs.pop("parallelism_config", None)
        _ulysses.check(parallelism, _error)
        super().__init__(*args, **kwargs)
        if parallelism is not None:
            self.state.parallelism_config = parallelism
            _context_parallel.set_up(self, parallelism, _error)
        kind = self.distributed_type
        if kind in (accelerate.DistributedType.DEEPSPEED, accelerate.DistributedType.FSDP,
                    accelerate.DistributedType.MEGATRON_LM):
            raise _error(f"accelerate is set up for {kind.value} (accelerate launch's "
                         "--use_deepspeed/--use_fsdp, or its config file); zeroshard does the "
                         "sharding here: launch without them (torchrun, or `zeroshard`)")
        self.zeroshard_config = {"zero_optimization": {"stage": "auto"}} \
            if zeroshard_config is None else zeroshard_config
        self.zeroshard_engine = None

    def _engine_config(self, loaders):
        config, origin = _config.as_mapping(self.zeroshard_config)
        _config.fill(config, "gradient_accumulation_steps", self.gradient_accumulation_steps,
              "Accelerator(gradient_accumulation_steps)", origin)
        precision = str(self.mixed_precision)
        if precision not in ("no", "bf16", "fp16"):
            raise _error(f"mixed_precision {precision!r}; allowed: 'no', 'bf16', 'fp16'")
        for key in ("bf16", "fp16"):
            _config.fill(config, f"{key}.enabled", precision == key, "Accelerator(mixed_precision)",
                  origin)
        # The loaders as the script made them (accelerate's prepared ones may say None), as
        # accelerate's DeepSpeed path reads them.
        sizes = {getattr(loader, "batch_size", None) for loader in loaders} - {None}
        if len(sizes) == 1:
            size = sizes.pop()
            if self.split_batches:
                size //= self.num_processes
            _config.fill(config, "train_micro_batch_size_per_gpu", size,
                         "the data loader's batch size", origin)
        return config

    def prepare(self, *args, device_placement=None):
        models = [i for i, a in enumerate(args) if isinstance(a, torch.nn.Module)]
        optimizers = [i for i, a in enumerate(args) if isinstance(a, torch.optim.Optimizer)]
        if len(models) > 1 or len(optimizers) > 1:
            raise _error(f"prepare() got {len(models)} models and {len(optimizers)} optimizers; "
                         "allowed: one model and at most one optimizer (one engine)")
        if models and self.zeroshard_engine is not None:
            raise _error("prepare() got a model, but the engine already trains one")
        if optimizers and not models:
            raise _error("prepare() got an optimizer without its model; prepare them together")
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise _error(f"prepare(): device_placement has {len(device_placement)} entries for "
                         f"{len(args)} objects")
        out = list(args)
        loaders = [a for a in args if isinstance(a, torch.utils.data.DataLoader)]
        self._zeroshard_loaders = getattr(self, "_zeroshard_loaders", []) + loaders
        for i, a in enumerate(args):
            if isinstance(a, torch.utils.data.DataLoader):
                out[i] = self.prepare_data_loader(a, device_placement=device_placement[i])
        if models:
            loaders = loaders or self._zeroshard_loaders
            client = args[optimizers[0]] if optimizers else None
            config = self._engine_config(loaders)
            mpu = self._sequence_parallel(args[models[0]], config, out)
            mesh = _context_parallel.prepare(self, args[models[0]])
            model = args[models[0]]
            # accelerate's prepare_model puts the model on accelerator.device (or, with
            # device_placement False, leaves it); the engine trains where it is put.
            where = self.device if device_placement[models[0]] else _placed_on(model)
            with _placement.chosen(where):
                engine, *_ = initialize(model=model, config=config, optimizer=client,
                                        mpu=mpu, mesh=mesh)
            self.zeroshard_engine = engine
            out[models[0]] = EngineModule(engine)
            if optimizers:
                out[optimizers[0]] = _EngineOptimizer(engine, client, self)
                self._optimizers.append(out[optimizers[0]])
        for i, a in enumerate(args):
            if isinstance(a, torch.optim.lr_scheduler.LRScheduler):
                out[i] = self.prepare_scheduler(a)
            elif i not in models and i not in optimizers and not isinstance(
                    a, torch.utils.data.DataLoader):
                out[i] = super().prepare(a, device_placement=[device_placement[i]])
        return out[0] if len(out) == 1 else tuple(out)

    def _sequence_parallel(self, model, config, prepared):
        """As accelerate's DeepSpeed path does with sp_size: Ulysses registered with
        transformers for the model's attention, the mpu for the engine, the config's
        sequence_parallel_size, and each data loader of this prepare() call adapted (a
        rank's draw shared with its group, each holding its slice). None without sp."""
        pc = self.parallelism_config
        if _ulysses.size(pc) <= 1:
            return None
        mpu = _ulysses.register(pc, model, config, "zeroshard_config", _error)
        for i, item in enumerate(prepared):
            if isinstance(item, torch.utils.data.DataLoader):
                prepared[i] = self.deepspeed_ulysses_dl_adapter(item, model)
        return mpu

    def deepspeed_ulysses_dl_adapter(self, dl, model):
        """A data loader prepared apart from the model, adapted after prepare(model) (as
        accelerate's DeepSpeed path names it, and the Trainer calls it)."""
        return _ulysses.adapted(self.parallelism_config, dl, self.device)

    def _engine_of(self, model):
        return model.engine if isinstance(model, EngineModule) else None

    def backward(self, loss, **kwargs):
        if self.zeroshard_engine is None:
            return super().backward(loss, **kwargs)
        loss = _context_parallel.scaled(loss, self.parallelism_config)
        self.zeroshard_engine.backward(loss, retain_graph=kwargs.pop("retain_graph", False))
        if kwargs:
            raise _error(f"backward(): {', '.join(sorted(kwargs))} not allowed; allowed: "
                         "retain_graph")

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        engine = self.zeroshard_engine
        if engine is None:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
        configured = engine.gradient_clipping()
        if norm_type != 2 or float(max_norm) != configured:
            raise _error(
                f"clip_grad_norm_(max_norm={max_norm}, norm_type={norm_type}): the engine clips "
                f"the global 2-norm at its step to the config's gradient_clipping ({configured}); "
                f"allowed: max_norm={configured}, or zeroshard_config with gradient_clipping: "
                f"{max_norm}")
        norm = engine.get_global_grad_norm()  # the last step's, as accelerate's DeepSpeed path
        return None if norm is None else torch.tensor(norm)

    def unwrap_model(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
        engine = self._engine_of(model)
        if engine is None:
            return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)
        return engine.module

    def get_state_dict(self, model, unwrap=True):
        """The whole state_dict (a collective: call it on every rank)."""
        engine = self._engine_of(model)
        return super().get_state_dict(model, unwrap) if engine is None else engine.state_dict()

    @contextlib.contextmanager
    def _engine_state_hooked(self, register, hook):
        """accelerate's save_state/load_state with the engine's checkpoint written or read by
        a pre-hook (which gets the folder accelerate resolved) and the engine's optimizer,
        whose state is in that checkpoint, kept out of accelerate's optimizer files."""
        engine_optimizers = [o for o in self._optimizers if isinstance(o, _EngineOptimizer)]
        self._optimizers = [o for o in self._optimizers if not isinstance(o, _EngineOptimizer)]
        handle = register(hook)
        try:
            yield
        finally:
            handle.remove()
            self._optimizers += engine_optimizers

    def save_state(self, output_dir=None, safe_serialization=True, **save_model_func_kwargs):
        """accelerate's folder (schedulers, samplers, RNG states, registered objects) with the
        engine's sharded checkpoint (model and optimizer) inside it, under 'zeroshard'. A
        collective. save_model_func_kwargs go to engine.save_checkpoint."""
        engine = self.zeroshard_engine
        if engine is None:
            return super().save_state(output_dir, safe_serialization, **save_model_func_kwargs)

        def save_engine(_models, _weights, folder):
            engine.save_checkpoint(folder, tag=ENGINE_TAG, **save_model_func_kwargs)

        with self._engine_state_hooked(self.register_save_state_pre_hook, save_engine):
            return super().save_state(output_dir, safe_serialization)

    def load_state(self, input_dir=None, load_kwargs=None, **load_model_func_kwargs):
        """What save_state wrote. load_model_func_kwargs other than map_location go to
        engine.load_checkpoint (load_module_strict, load_optimizer_states, ...)."""
        engine = self.zeroshard_engine
        if engine is None:
            return super().load_state(input_dir, load_kwargs, **load_model_func_kwargs)
        accelerate_own = {k: load_model_func_kwargs.pop(k) for k in ("map_location",)
                          if k in load_model_func_kwargs}

        def load_engine(_models, folder):
            if not os.path.isdir(os.path.join(folder, ENGINE_TAG)):
                raise _error(f"load_state('{folder}'): no '{ENGINE_TAG}' folder in it (the "
                             "engine's checkpoint, which this Accelerator's save_state writes)")
            engine.load_checkpoint(folder, tag=ENGINE_TAG, **load_model_func_kwargs)

        with self._engine_state_hooked(self.register_load_state_pre_hook, load_engine):
            return super().load_state(input_dir, load_kwargs, **accelerate_own)
