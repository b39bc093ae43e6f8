"""zeroshard.runtime.sequence_parallel: parallel_state_sp, the sequence-parallel groups;
ulysses_sp, ALST's Hugging Face path."""
from ..._common import refusals as _refusals
from . import parallel_state_sp, ulysses_sp  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
