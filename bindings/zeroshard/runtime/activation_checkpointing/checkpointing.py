"""deepspeed.runtime.activation_checkpointing.checkpointing: zeroshard.checkpointing."""
from ...checkpointing import *  # noqa: F401,F403
from ...checkpointing import checkpoint, configure, is_configured  # noqa: F401
from ..._common import refusals as _refusals  # noqa: E402

# A DeepSpeed name of this module that zeroshard lacks is refused by name.
__getattr__ = _refusals.attribute_refuser(__name__)
