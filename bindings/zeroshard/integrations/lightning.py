"""zeroshard.integrations.ZeroShardStrategy: PyTorch Lightning's Trainer, with the
LightningModule trained by zeroshard's engine. A Lightning script switches its strategy:

    from zeroshard.integrations import ZeroShardStrategy
    Trainer(strategy=ZeroShardStrategy(stage=3))      # or strategy="zeroshard_stage_3"

The split of the work follows Lightning's own DeepSpeedStrategy (its loop is kept whole):
- Lightning's arguments win: accumulate_grad_batches, gradient_clip_val and precision fill
  the config (DeepSpeed's keys) where it leaves them out or says 'auto'; a config value that
  contradicts them is an error naming both. The config holds ZeRO's keys (stage, offload,
  buckets); configure_optimizers makes the optimizer and the LR scheduler (the engine takes
  the optimizer over; Lightning steps the scheduler, whose lr the engine reads each step).
- The strategy handles accumulation: Lightning calls the optimizer step after every
  micro-batch, the engine steps at the window's end. Lightning divides each micro-batch's
  loss by accumulate_grad_batches and the engine averages over the window itself, so the
  loss reaches the engine multiplied back: the gradients are DDP's.
- Checkpoints are the engine's sharded ones (a folder per checkpoint path, every rank
  writing its shards), Lightning's own state (loops, callbacks, schedulers) inside them.
torch.distributed, which Lightning starts, and the engine share the rendezvous store."""
import copy
import os
from contextlib import nullcontext

import torch
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn

from .._common import config as _config
from .._engine.construction import Init
from .._engine.engine import EngineModule
from .._engine.initialize import initialize
from .._parallel import placement as _placement

# Lightning's precision flags and the engine's switch for each (None: fp32). '-true' and
# '-mixed' alike keep fp32 master weights in the engine, as under Lightning's DeepSpeed.
from ._fabric import ZeroShardFabricStrategy  # noqa: F401  (the same names, for Fabric)
from ._lightning_common import (NAMES, PRECISIONS, _partial_window, check_checkpoint_folder,
                                convert_input, decode_state, encode_state, error, export_launch_env,
                                fill_precision, only_timeout, precision_of, strategy_config)


class ZeroShardPrecision(Precision):
    """Lightning's precision flag, carried out by the engine: its bf16/fp16 modes (fp16 with
    its loss scaling), backward and step through it, clipping at its step."""

    def __init__(self, precision="32-true"):
        if precision not in PRECISIONS:
            raise error(f"precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
        self.precision = precision
        self.clipping = None  # the engine's gradient_clipping, once it is made

    def convert_input(self, data):
        return convert_input(data, self.precision)

    def forward_context(self):
        return nullcontext()  # no autocast: the engine's weights are in the compute dtype

    def backward(self, tensor, model, optimizer, *args, **kwargs):
        model.trainer.strategy.engine_backward(tensor, model.automatic_optimization, **kwargs)
        if args:
            raise error("backward(): positional arguments are not taken by the engine")

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        if isinstance(optimizer, torch.optim.LBFGS):
            raise error("LBFGS re-evaluates the model within a step; the engine steps once per "
                        "accumulation window: allowed: a first-order optimizer")
        result = closure()
        self._after_closure(model, optimizer)
        if model.automatic_optimization and result is None:
            raise error("training_step returned None (skip this batch): every rank must run "
                        "backward for each micro-batch, as the engine reduces gradients across "
                        "them; return the loss")
        return model.trainer.strategy.engine_step(optimizer, **kwargs)

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=None):
        """The engine clips the global 2-norm at its step to the config's gradient_clipping,
        which Trainer(gradient_clip_val) fills; another value here is refused."""
        if not clip_val or clip_val <= 0:
            return
        if str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)) == "value":
            raise error("gradient_clip_algorithm 'value': the engine clips by the global norm; "
                        "allowed: 'norm'")
        configured = self.clipping
        if configured is not None and float(clip_val) != configured:
            raise error(f"clip_gradients(clip_val={clip_val}): the engine clips at its step to "
                        f"the config's gradient_clipping ({configured}); allowed: that value, or "
                        "Trainer(gradient_clip_val=...) and the config agreeing")


def as_zeroshard_precision(plugin):
    """The precision plugin Lightning made from Trainer(precision=...), as the engine's."""
    if plugin is None or isinstance(plugin, ZeroShardPrecision):
        return plugin
    return ZeroShardPrecision(precision_of(plugin, (Precision, MixedPrecision, HalfPrecision),
                                           "ZeroShardStrategy"))


class ZeroShardStrategy(DDPStrategy):
    """Trainer(strategy=ZeroShardStrategy(config=..., stage=..., offload_optimizer=...,
    offload_parameters=..., sequence_parallel_size=...)). config: a path to YAML or JSON, or
    a dict, DeepSpeed's keys; default: the planner picks the stage. sequence_parallel_size
    (the config's key): each group of that many consecutive ranks splits the same samples'
    sequences (the module's training_step takes its slice, zeroshard.utils.groups says
    which, and returns its share of the group's mean loss), so the train loader's sampler
    counts a group once."""

    strategy_name = "zeroshard"

    def __init__(self, config=None, stage=None, offload_optimizer=False,
                 offload_parameters=False, offload_optimizer_device="cpu",
                 offload_params_device="cpu", nvme_path=None, accelerator=None,
                 parallel_devices=None, cluster_environment=None, checkpoint_io=None,
                 precision_plugin=None, process_group_backend=None,
                 sequence_parallel_size=None, **timeout):
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin,
                         process_group_backend=process_group_backend,
                         **only_timeout(timeout, "ZeroShardStrategy"))
        self.config, self._origin = strategy_config(
            config, stage, offload_optimizer, offload_parameters, offload_optimizer_device,
            offload_params_device, nvme_path)
        if sequence_parallel_size is not None:
            _config.fill(self.config, "sequence_parallel_size", sequence_parallel_size,
                         "ZeroShardStrategy(sequence_parallel_size)", self._origin)
        self.engine = None

    @property
    def distributed_sampler_kwargs(self):
        """A sequence-parallel group's ranks draw the same samples (DeepSpeed's data-parallel
        rank: rank // sequence_parallel_size)."""
        sp = self.config.get("sequence_parallel_size", 1)
        sp = sp if isinstance(sp, int) and sp > 1 else 1
        kwargs = super().distributed_sampler_kwargs
        return {"num_replicas": kwargs["num_replicas"] // sp, "rank": kwargs["rank"] // sp}

    # Lightning hands the strategy the plugin made from Trainer(precision=...).
    @property
    def precision_plugin(self):
        return self._precision_plugin if self._precision_plugin is not None else ZeroShardPrecision()

    @precision_plugin.setter
    def precision_plugin(self, plugin):
        self._precision_plugin = as_zeroshard_precision(plugin)

    @property
    def handles_gradient_accumulation(self):
        return True

    @property
    def restore_checkpoint_after_setup(self):
        return True  # the engine's checkpoint loads into the engine, made in setup()

    @property
    def lightning_restore_optimizer(self):
        return False  # the engine's checkpoint holds the optimizer's state

    def setup_distributed(self):
        super().setup_distributed()
        export_launch_env(self)

    def _engine_config(self, trainer):
        config, origin = copy.deepcopy(self.config), self._origin
        _config.fill(config, "gradient_accumulation_steps", trainer.accumulate_grad_batches,
                     "Trainer(accumulate_grad_batches)", origin)
        if str(getattr(trainer.gradient_clip_algorithm, "value", "norm")) == "value":
            raise error("Trainer(gradient_clip_algorithm='value'): the engine clips by the "
                        "global norm; allowed: 'norm'")
        _config.fill(config, "gradient_clipping", float(trainer.gradient_clip_val or 0.0),
                     "Trainer(gradient_clip_val)", origin)
        fill_precision(config, self.precision_plugin.precision, "Trainer(precision)", origin)
        size = self._loader_batch_size(trainer)
        if size is not None:
            _config.fill(config, "train_micro_batch_size_per_gpu", size,
                         "the train dataloader's batch size", origin)
        return config

    @staticmethod
    def _loader_batch_size(trainer):
        source = trainer.fit_loop._data_source
        if trainer.state.fn != TrainerFn.FITTING or not source.is_defined():
            return None
        loader = source.dataloader()
        return getattr(getattr(loader, "batch_sampler", None), "batch_size", None)

    def setup(self, trainer):
        self.accelerator.setup(trainer)
        module = self.lightning_module
        if self.engine is None:
            optimizers, schedulers = _init_optimizers_and_lr_schedulers(module)
            if len(optimizers) > 1:
                raise error(f"configure_optimizers returned {len(optimizers)} optimizers; "
                            "allowed: one (one engine steps one optimizer)")
            with _placement.chosen(self.root_device):  # Lightning's model_to_device
                self.engine = initialize(model=module, config=self._engine_config(trainer),
                                         optimizer=optimizers[0] if optimizers else None)[0]
            self.precision_plugin.clipping = self.engine.gradient_clipping()
            self._client_optimizers, self._schedulers = optimizers, schedulers
        elif self.engine.module is not module:
            raise error("this strategy's engine trains another LightningModule; make one "
                        "ZeroShardStrategy per module")
        self.model = EngineModule(self.engine)
        self.optimizers = self._client_optimizers
        self.lr_scheduler_configs = self._schedulers
        self.barrier()

    def model_sharded_context(self):
        """configure_model builds the model sharded across the ranks at stage 3
        (zeroshard.init), as DeepSpeed's zero.Init does."""
        return Init(config=self.config)

    def on_train_start(self):
        super().on_train_start()
        trainer = self.lightning_module.trainer
        batches, windows = trainer.num_training_batches, trainer.accumulate_grad_batches
        if batches != float("inf") and batches % windows:
            raise error(_partial_window(f"an epoch has {batches} batches per rank", windows))

    def engine_backward(self, loss, automatic, **kwargs):
        retain = kwargs.pop("retain_graph", False)
        if kwargs:
            raise error(f"backward(): {', '.join(sorted(kwargs))} not allowed; allowed: "
                        "retain_graph")
        # Lightning divided the loss by accumulate_grad_batches; the engine averages itself.
        windows = self.lightning_module.trainer.accumulate_grad_batches if automatic else 1
        self.engine.backward(loss * windows if windows != 1 else loss, retain_graph=retain)

    def engine_step(self, optimizer, **kwargs):
        if kwargs:
            raise error(f"optimizer.step(): {', '.join(sorted(kwargs))} not allowed")
        trainer = self.lightning_module.trainer
        lightning_steps = not trainer.fit_loop._should_accumulate()
        engine_steps = self.engine.is_gradient_accumulation_boundary()
        if lightning_steps != engine_steps:
            raise error(_partial_window(
                f"Lightning {'ends' if lightning_steps else 'does not end'} the accumulation "
                f"window at this batch and the engine {'does' if engine_steps else 'does not'}",
                trainer.accumulate_grad_batches))
        stepped = self.engine.step()
        optimizer._opt_called = True  # what a scheduler checks its optimizer stepped by
        return stepped

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        """A collective: every rank writes its shards to the folder `filepath`."""
        if storage_options is not None:
            raise TypeError("Trainer.save_checkpoint(..., storage_options=...): not taken by "
                            "ZeroShardStrategy (the engine writes the checkpoint itself)")
        filepath = self.broadcast(os.fspath(filepath))
        state = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        text = encode_state(state, "ZeroShardStrategy.save_checkpoint: the Lightning state")
        os.makedirs(filepath, exist_ok=True)  # ModelCheckpoint's dirpath may not exist yet
        self.engine.save_checkpoint(filepath, tag="checkpoint", client_state={"lightning": text})

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        path = check_checkpoint_folder(checkpoint_path)
        module = self.lightning_module
        fitting = module.trainer.state.fn == TrainerFn.FITTING
        _, client = self.engine.load_checkpoint(path, load_optimizer_states=fitting,
                                                load_lr_scheduler_states=False,
                                                load_module_strict=module.strict_loading)
        if not client or "lightning" not in client:
            raise error(f"checkpoint '{path}' holds no Lightning state (saved by another "
                        "front-end); load it with engine.load_checkpoint")
        return decode_state(client["lightning"], weights_only, path)

    def load_model_state_dict(self, checkpoint, strict=True):
        pass  # load_checkpoint loaded the engine's parameters

    def load_optimizer_state_dict(self, checkpoint):
        pass  # and the optimizer's state

    def remove_checkpoint(self, filepath):
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)

    def teardown(self):
        # Lightning's moves the module and the optimizers to the CPU; the engine holds them.
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    @classmethod
    def register_strategies(cls, registry):
        for name, description, kwargs in NAMES:
            if name not in registry:
                registry.register(name, cls, description=description, **kwargs)


ZeroShardStrategy.register_strategies(StrategyRegistry)

