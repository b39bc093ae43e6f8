"""deepspeed.runtime.activation_checkpointing: its checkpointing module."""
from . import checkpointing  # noqa: F401
