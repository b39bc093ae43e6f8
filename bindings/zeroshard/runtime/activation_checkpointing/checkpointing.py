"""deepspeed.runtime.activation_checkpointing.checkpointing: zeroshard.checkpointing."""
from ...checkpointing import *  # noqa: F401,F403
from ...checkpointing import checkpoint, configure, is_configured  # noqa: F401
