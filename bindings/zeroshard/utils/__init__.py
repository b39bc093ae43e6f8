"""zeroshard.utils: deepspeed.utils' names as scripts import them: RepeatingLoader, the
logger and log_dist, and the modules below it that zeroshard has."""
from . import logging  # noqa: F401
from .logging import log_dist, logger  # noqa: F401
from ..runtime.dataloader import RepeatingLoader  # noqa: F401
