"""zeroshard.initialize: deepspeed.initialize's signature, every keyword honoured or
refused with a reason; none is dropped. Returns (engine, optimizer, dataloader,
lr_scheduler) as DeepSpeed does."""
import os

import torch

from .. import _zeroshard
from .._activations import checkpointing as _checkpointing
from .engine import ZeroShardEngine


def _error(message):
    return _zeroshard.Error(f"zeroshard.initialize: {message}")


class ConfigScheduler:
    """The config's scheduler (DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR,
    OneCycle, LRRangeTest; config/LrSchedule.h): the engine advances it after each applied
    optimizer step, as DeepSpeed's engine does, and writes its lr into every group."""

    def __init__(self, engine):
        self._engine = engine

    def get_last_lr(self):
        return self._engine.get_lr()

    get_lr = get_last_lr

    @property
    def last_batch_iteration(self):
        """DeepSpeed's position: -1 before the first advance."""
        return self._engine._engine.schedule_steps - 1

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def step(self):
        pass  # the engine advances it with each optimizer step


def _check_port(distributed_port):
    """DeepSpeed's rendezvous port: used where the launcher set none."""
    if distributed_port is None:
        return
    set_port = os.environ.get("MASTER_PORT")
    if set_port is None:
        os.environ["MASTER_PORT"] = str(distributed_port)
    elif set_port != str(distributed_port):
        raise _error(f"distributed_port={distributed_port}, but the launcher set MASTER_PORT="
                     f"{set_port}; pass the same port or leave distributed_port out")


def _refuse_unsupported(mesh_param):
    if mesh_param is not None:
        raise _error(f"mesh_param={mesh_param!r}: device meshes are not supported; allowed: None")


def _dataloader(training_data, engine, collate_fn):
    """DeepSpeed's: the engine's loader over training_data (engine.deepspeed_io), kept as
    engine.training_dataloader; a pipeline engine's first and last stages read theirs in
    order, repeating (its set_dataloader)."""
    engine.collate_fn = collate_fn
    if training_data is None:
        if collate_fn is not None:
            raise _error("collate_fn is given without training_data; it only shapes the "
                         "dataloader built from training_data")
        return None
    engine.training_dataloader = engine.deepspeed_io(training_data)
    if hasattr(engine, "build_data_iter"):
        engine.build_data_iter(training_data)
    return engine.training_dataloader


def add_config_arguments(parser):
    """deepspeed.add_config_arguments: --deepspeed and --deepspeed_config (and their older
    --deepscale spellings), and --zeroshard_config; initialize(args=...) reads the config
    file from them. Returns the parser."""
    group = parser.add_argument_group("zeroshard", "zeroshard (DeepSpeed-compatible) configuration")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="a flag for the script's own use (as with DeepSpeed)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="the config file (DeepSpeed JSON or zeroshard YAML)")
    group.add_argument("--zeroshard_config", default=None, type=str,
                       help="the config file; the same as --deepspeed_config")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="DeepSpeed's older name of --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="DeepSpeed's older name of --deepspeed_config")
    return parser


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=None, mpu=None, dist_init_required=None,
               collate_fn=None, config=None, mesh_param=None, config_params=None, units=None,
               mesh=None):
    """deepspeed.initialize's shape: returns (engine, optimizer, dataloader, lr_scheduler).

    model_parameters: tensors (one group) or dicts with 'params' and any of lr, betas,
    eps, weight_decay (parameter groups; unset keys from the config's optimizer).
    optimizer: a torch.optim.AdamW or Adam (its groups and hyperparameters are used, the
    sharded optimizer steps), or a callable making one from the model parameters.
    lr_scheduler: a scheduler on that optimizer, or a callable taking the optimizer
    initialize returns; stepped after each optimizer step.
    dist_init_required: accepted; zeroshard makes its own process groups either way.
    mpu: a Megatron mpu for a tensor-parallel model (its parameters marked
    tensor_model_parallel=True); ZeRO shards over its data-parallel ranks.
    mesh: the ("dp", "tp") DeviceMesh whose "tp" dimension parallelize_module split the
    model over (checked against the parameters' own; they alone suffice); or a ("dp", "cp")
    one whose "cp" groups run torch's context_parallel (ring attention): they count as a
    sequence-parallel group does (each rank's loss its share of the group's mean).
    units: stage-3 blocks (modules or their names); default the blocks of every
    ModuleList, ModuleDict and Sequential. Every other parameter is in a unit too, cut
    around them (docs/architecture.md "Stage-3 units")."""
    if model is None:
        raise _error("model is required")
    if config is not None and config_params is not None:
        raise _error("config and config_params are both given; config_params is the older "
                     "name of config: pass one")
    config = config if config is not None else config_params
    if config is None:  # add_config_arguments' flags
        named = {k: getattr(args, k) for k in ("zeroshard_config", "deepspeed_config",
                                               "deepscale_config") if getattr(args, k, None)}
        if len(set(named.values())) > 1:
            raise _error(f"args name different config files: {named}; give one")
        config = next(iter(named.values()), None)
    if config is None:
        raise _error("config is required (a path or a dict, or args.deepspeed_config)")
    _refuse_unsupported(mesh_param)
    _check_port(distributed_port)
    engine_class = ZeroShardEngine
    from .._parallel.pipe_module import PipelineModule
    if isinstance(model, PipelineModule):
        from .pipe_engine import PipelineEngine
        engine_class = PipelineEngine
    engine = engine_class(model, config, units=units, model_parameters=model_parameters,
                          optimizer=optimizer, lr_scheduler=lr_scheduler, mpu=mpu, mesh=mesh)
    _checkpointing.configure_from_config(config, mpu)
    engine.get_sequence_parallel_group()  # made here, on every rank alike, where it is new
    loader = _dataloader(training_data, engine, collate_fn)
    scheduler = engine.lr_scheduler
    if scheduler is None and engine.scheduled_by_config:
        scheduler = ConfigScheduler(engine)
    return engine, engine.optimizer, loader, scheduler
