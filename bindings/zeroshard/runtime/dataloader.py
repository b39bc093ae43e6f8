"""deepspeed.runtime.dataloader: RepeatingLoader and DeepSpeedDataLoader (_dataloader.py)."""
from .._dataloader import DeepSpeedDataLoader, RepeatingLoader  # noqa: F401
