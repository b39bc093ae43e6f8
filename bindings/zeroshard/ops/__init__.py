"""zeroshard.ops: deepspeed.ops' optimizers as scripts import them (adam, adagrad) and its
fused BERT layer (transformer) in torch's ops; its other kernels (sparse attention, Lion,
the op builders) are refused by name."""
from .._common import refusals as _refusals
from . import adagrad, adam, transformer  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
