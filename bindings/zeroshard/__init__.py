"""zeroshard: ZeRO sharding (stages 0-3) with host/NVMe offload for ordinary PyTorch
models, a C++ runtime behind a deepspeed.initialize-shaped API.

    engine, optimizer, _, scheduler = zeroshard.initialize(model=model,
                                                           config="configs/zero3.yaml")
    for batch in data:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
"""
import torch as _torch

from ._build_info import TORCH_VERSION as _BUILT_FOR

if _torch.__version__.split("+")[0] != _BUILT_FOR:
    raise ImportError(
        f"zeroshard was built against torch {_BUILT_FOR}, but this interpreter imports torch "
        f"{_torch.__version__} ({_torch.__file__}); rebuild zeroshard against it "
        "(pip install --force-reinstall ., or ./zs build)")

from ._zeroshard import Error  # noqa: E402
from ._common.config import load_config  # noqa: E402
from ._checkpoint.consolidate import consolidate
from ._engine.construction import Init, init
from ._engine.engine import ZeroShardEngine
from .inference.engine import init_inference
from ._engine.initialize import initialize
from ._engine.optimizer import ZeroShardOptimizer
from ._tools.estimate import estimate
from . import accelerator, comm, zero  # noqa: E402  (deepspeed.accelerator, .comm, .zero)
# The rest of deepspeed's module tree that scripts import; what it lacks is refused by name.
from ._common import refusals as _refusals  # noqa: E402
from . import checkpoint, checkpointing, compression, constants, inference, launcher, ops, runtime, utils  # noqa: E402,E501
from .ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer  # noqa: E402
from .accelerator import get_accelerator  # noqa: E402
from .runtime.config import DeepSpeedConfig  # noqa: E402
from .runtime.engine import DeepSpeedEngine  # noqa: E402
from .utils import OnDevice  # noqa: E402
from ._build_info import VERSION as __version__  # noqa: E402
from .comm import init_distributed  # noqa: E402
from ._engine.initialize import add_config_arguments  # noqa: E402
from ._checkpoint.deepspeed_checkpoint import convert_deepspeed_checkpoint  # noqa: E402
from ._checkpoint.deepspeed_universal import convert_to_deepspeed_checkpoint  # noqa: E402

__all__ = ["Error", "ZeroShardEngine", "ZeroShardOptimizer", "initialize", "init_inference",
           "init", "Init",
           "estimate", "load_config", "consolidate", "init_distributed",
           "add_config_arguments", "convert_deepspeed_checkpoint",
           "convert_to_deepspeed_checkpoint", "accelerator", "comm", "zero",
           "DeepSpeedConfig", "DeepSpeedEngine", "OnDevice", "get_accelerator", "runtime",
           "utils", "ops", "checkpoint", "constants", "launcher", "compression", "inference",
           "DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "checkpointing"]

_refusals.install()
# Heavier: imported when first read.
_lazy = ("pipe", "pipelining", "moe", "integrations", "sequence")
_refused = _refusals.attribute_refuser(__name__, lazy=_lazy)


def __getattr__(name):
    if name == "PipelineEngine":  # deepspeed.PipelineEngine, for isinstance checks
        from ._engine.pipe_engine import PipelineEngine
        return PipelineEngine
    return _refused(name)
