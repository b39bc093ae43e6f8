"""zeroshard.utils: deepspeed.utils' names as scripts import them: RepeatingLoader, the
logger and log_dist, OnDevice, the timer names, groups' getters. DeepSpeed's ZeRO-3
helpers that zeroshard lacks are refused by name (_common/refusals.py)."""
from .._common import refusals as _refusals
from . import logging, timer  # noqa: F401
from .init_on_device import OnDevice  # noqa: F401
from .logging import log_dist, logger  # noqa: F401
from .._engine.dataloader import RepeatingLoader  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__, lazy=("groups",))
