"""zeroshard.runtime.sequence_parallel: parallel_state_sp, the sequence-parallel groups.
ALST's Hugging Face path (ulysses_sp) is refused by name (_common/refusals.py)."""
from ..._common import refusals as _refusals
from . import parallel_state_sp  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
