"""zeroshard.runtime: deepspeed.runtime's module tree as scripts import it (utils,
dataloader, engine, config, pipe, zero, lr_schedules); each module holds DeepSpeed's names
that zeroshard runs, and names the ones it does not."""
from . import dataloader, utils  # noqa: F401  (deepspeed.runtime.utils.set_random_seed(...))
