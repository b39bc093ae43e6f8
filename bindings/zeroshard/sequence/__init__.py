"""zeroshard.sequence: deepspeed.sequence as scripts import it: layer's DistributedAttention
(Ulysses: zeroshard/_sequence/sequence_parallel.py). DeepSpeed's FPDT, its automatic
wrapping and its vocabulary-parallel losses are refused by name (_common/refusals.py)."""
from .._common import refusals as _refusals
from . import layer  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
