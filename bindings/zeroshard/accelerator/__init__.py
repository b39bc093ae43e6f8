"""zeroshard.accelerator: deepspeed.accelerator's names (real_accelerator holds them)."""
from .real_accelerator import get_accelerator, is_current_accelerator_supported  # noqa: F401
