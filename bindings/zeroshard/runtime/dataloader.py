"""deepspeed.runtime.dataloader: RepeatingLoader and DeepSpeedDataLoader (_engine/dataloader.py)."""
from .._engine.dataloader import DeepSpeedDataLoader, RepeatingLoader  # noqa: F401
