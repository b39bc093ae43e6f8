"""zeroshard.checkpoint: deepspeed.checkpoint's helpers that scripts call (utils); its
universal checkpoint format is refused by name (_common/refusals.py)."""
from .._common import refusals as _refusals
from . import utils  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
