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
import base64
import copy
import io
import os
from contextlib import nullcontext

import torch
from lightning.fabric.plugins.precision.utils import _convert_fp_tensor
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from lightning_utilities.core.apply_func import apply_to_collection

from . import _config, _safe_load, _zeroshard
from ._construction import Init
from ._engine import EngineModule
from ._initialize import initialize

# Lightning's precision flags and the engine's switch for each (None: fp32). '-true' and
# '-mixed' alike keep fp32 master weights in the engine, as under Lightning's DeepSpeed.
PRECISIONS = {"32-true": None, "bf16-mixed": "bf16", "bf16-true": "bf16", "16-mixed": "fp16",
              "16-true": "fp16"}


def error(message):
    return _zeroshard.Error(f"ZeroShardStrategy: {message}")


def strategy_config(config, stage, offload_optimizer, offload_parameters,
                    offload_optimizer_device, offload_params_device, nvme_path):
    """(the config as a dict, its origin): `config` (a path or a dict, DeepSpeed's keys)
    with the strategy's own arguments filled in, a contradiction an error."""
    config, origin = _config.as_mapping({} if config is None else config)
    if stage is not None:
        _config.fill(config, "zero_optimization.stage", stage, "ZeroShardStrategy(stage)", origin)
    config.setdefault("zero_optimization", {}).setdefault("stage", "auto")
    for on, key, device in ((offload_optimizer, "offload_optimizer", offload_optimizer_device),
                            (offload_parameters, "offload_param", offload_params_device)):
        if not on:
            continue
        _config.fill(config, f"zero_optimization.{key}.device", device,
                     f"ZeroShardStrategy({key}_device)", origin)
        if nvme_path is not None and device == "nvme":
            _config.fill(config, f"zero_optimization.{key}.nvme_path", os.fspath(nvme_path),
                         "ZeroShardStrategy(nvme_path)", origin)
    for section, instead in (("optimizer", "LightningModule.configure_optimizers makes it"),
                             ("scheduler", "configure_optimizers' lr_scheduler drives every lr")):
        if section in config:
            raise error(f"{origin}: the '{section}' section is not allowed with Lightning; {instead}")
    return config, origin


def only_timeout(kwargs, who):
    """The strategies' **kwargs: Lightning's `timeout` alone."""
    unknown = set(kwargs) - {"timeout"}
    if unknown:
        raise _zeroshard.Error(
            f"{who}: {', '.join(sorted(unknown))}: not an argument of {who}; DeepSpeed's other "
            "settings go in the config under their DeepSpeed keys")
    return kwargs


def export_launch_env(strategy):
    """The engine reads the launch from the environment, as torchrun leaves it; Lightning's
    own launcher sets only part of it."""
    for name, value in (("RANK", strategy.global_rank), ("WORLD_SIZE", strategy.world_size),
                        ("LOCAL_RANK", strategy.local_rank)):
        os.environ.setdefault(name, str(value))


def precision_of(plugin, plain_types, who):
    """The precision flag a Trainer's or Fabric's plain plugin was made from; any other
    plugin refused."""
    if type(plugin) not in plain_types:
        raise _zeroshard.Error(
            f"{who}: precision plugin {type(plugin).__name__}: the engine keeps the weights' "
            f"dtypes itself; allowed: precision=... with one of {', '.join(PRECISIONS)}")
    return getattr(plugin, "precision", "32-true")


def fill_precision(config, precision, source, origin):
    if precision not in PRECISIONS:
        raise error(f"precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    for key in ("bf16", "fp16"):
        _config.fill(config, f"{key}.enabled", PRECISIONS[precision] == key, source, origin)


def half_dtype(precision):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISIONS.get(precision))


def convert_input(data, precision):
    """Floating-point inputs in the engine's compute dtype (its weights are in it)."""
    dtype = half_dtype(precision)
    if dtype is None:
        return data
    return apply_to_collection(data, function=_convert_fp_tensor, dtype=torch.Tensor,
                               dst_type=dtype)


def encode_state(state, whose):
    """Lightning's checkpoint entries (the loops', callbacks' and schedulers' state dicts:
    tensors and plain values) as text, so they travel inside the engine's checkpoint
    manifest and are written with it, atomically. What would not load back without
    running code (decode_state reads it restricted) is refused now, by name."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    _safe_load.check_loadable(buffer.getvalue(), whose)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_state(text, weights_only, where):
    """encode_state's entries back: restricted unpickling (_safe_load.py) unless the caller
    passed weights_only=False, Lightning's own way to trust a checkpoint; None (Lightning's
    default) and True are restricted, as torch.load's default is."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as e:
        raise error(f"checkpoint '{where}': its Lightning state is not base64 ({e})") from None
    return _safe_load.load(io.BytesIO(raw), f"checkpoint '{where}' (its Lightning state)",
                           trust=weights_only is False,
                           how_to_trust="weights_only=False (e.g. Trainer.fit(ckpt_path=..., "
                           "weights_only=False))")


def check_checkpoint_folder(path):
    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "latest")):
        raise error(f"checkpoint '{path}' is not a zeroshard checkpoint (a folder with a 'latest' "
                    "file, as this strategy saves); allowed: a path ModelCheckpoint or "
                    "trainer.save_checkpoint wrote with ZeroShardStrategy")
    return path


def _partial_window(what, windows):
    return (f"{what}, not a multiple of accumulate_grad_batches {windows}: each epoch's "
            "end cuts a window short (DDP steps on it), and the engine's windows are always "
            f"{windows} micro-batches long; allowed: a batch count per epoch that {windows} "
            "divides (the loader's drop_last or batch size, Trainer(limit_train_batches=...))")


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
    offload_parameters=...)). config: a path to YAML or JSON, or a dict, DeepSpeed's keys;
    default: the planner picks the stage."""

    strategy_name = "zeroshard"

    def __init__(self, config=None, stage=None, offload_optimizer=False,
                 offload_parameters=False, offload_optimizer_device="cpu",
                 offload_params_device="cpu", nvme_path=None, accelerator=None,
                 parallel_devices=None, cluster_environment=None, checkpoint_io=None,
                 precision_plugin=None, process_group_backend=None, **timeout):
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin,
                         process_group_backend=process_group_backend,
                         **only_timeout(timeout, "ZeroShardStrategy"))
        self.config, self._origin = strategy_config(
            config, stage, offload_optimizer, offload_parameters, offload_optimizer_device,
            offload_params_device, nvme_path)
        self.engine = None

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


NAMES = [
    ("zeroshard", "zeroshard, the stage the planner picks", {}),
    ("zeroshard_stage_1", "zeroshard ZeRO stage 1", {"stage": 1}),
    ("zeroshard_stage_2", "zeroshard ZeRO stage 2", {"stage": 2}),
    ("zeroshard_stage_2_offload", "zeroshard ZeRO stage 2, the optimizer on the CPU",
     {"stage": 2, "offload_optimizer": True}),
    ("zeroshard_stage_3", "zeroshard ZeRO stage 3", {"stage": 3}),
    ("zeroshard_stage_3_offload", "zeroshard ZeRO stage 3, optimizer and parameters on the CPU",
     {"stage": 3, "offload_optimizer": True, "offload_parameters": True}),
    ("zeroshard_stage_3_offload_nvme", "zeroshard ZeRO stage 3, optimizer and parameters on NVMe",
     {"stage": 3, "offload_optimizer": True, "offload_parameters": True,
      "offload_optimizer_device": "nvme", "offload_params_device": "nvme"}),
]

ZeroShardStrategy.register_strategies(StrategyRegistry)
