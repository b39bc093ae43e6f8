"""zeroshard.runtime: deepspeed.runtime's module tree as scripts import it: utils,
dataloader, engine, config, lr_schedules, pipe, zero, activation_checkpointing and
sequence_parallel. A DeepSpeed module or name it does not carry is refused by name
(bindings/zeroshard/_common/refusals.py)."""
from .._common import refusals as _refusals
from . import activation_checkpointing, config, dataloader, engine, lr_schedules, utils, zero  # noqa: F401,E501

# pipe is imported when first read: it brings torch.distributed.pipelining.
__getattr__ = _refusals.attribute_refuser(__name__, lazy=("pipe", "sequence_parallel"))
