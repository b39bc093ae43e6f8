"""What the Lightning Trainer's strategy (lightning.py) and Fabric's (integrations/_fabric.py) share: the
config from the strategy's arguments and Lightning's flags, precision names, the launch
environment, and the client state kept inside the engine's checkpoint (encoded so that it
loads back without running code)."""
import base64
import io
import os

import torch
from lightning.fabric.plugins.precision.utils import _convert_fp_tensor
from lightning_utilities.core.apply_func import apply_to_collection

from .._common import config as _config
from .._checkpoint import safe_load as _safe_load
from .. import _zeroshard

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
    """encode_state's entries back: restricted unpickling (_checkpoint/safe_load.py) unless the caller
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
