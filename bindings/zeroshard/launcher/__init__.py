"""zeroshard.launcher: deepspeed.launcher's names (runner)."""
from . import runner  # noqa: F401
