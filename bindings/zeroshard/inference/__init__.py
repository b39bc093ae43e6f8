"""zeroshard.inference: deepspeed.inference's engine class (what init_inference returns);
DeepSpeed-FastGen and its configs are refused by name (_common/refusals.py)."""
from .._common import refusals as _refusals
from .engine import InferenceEngine  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
