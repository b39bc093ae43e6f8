"""zeroshard.compression: deepspeed.compression's module helpers (helper); its compression
library itself is refused by name (_common/refusals.py)."""
from .._common import refusals as _refusals
from . import helper  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
