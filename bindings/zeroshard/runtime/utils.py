"""deepspeed.runtime.utils: the helpers training scripts call."""
import gc
import random

import torch

from .._common import refusals as _refusals

__getattr__ = _refusals.attribute_refuser(__name__)


def set_random_seed(seed):
    """Seeds Python's, numpy's and torch's generators, as DeepSpeed's does."""
    import numpy
    random.seed(seed)
    numpy.random.seed(seed % (2**32))  # numpy takes 32-bit seeds
    torch.manual_seed(seed % (2**63))


def move_to_device(item, device, criterion_func=None):
    """`item` (a tensor, or lists, tuples and dicts of them) on `device`; a tensor for
    which criterion_func is true is moved in place (its .data replaced), as DeepSpeed's."""
    if criterion_func is not None and criterion_func(item):
        item.data = item.to(device).data
        return item
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item.to(device)


def see_memory_usage(message, force=False):
    """Prints `message` and the accelerator's memory figures on rank 0, when force is true
    (DeepSpeed's default prints nothing)."""
    if not force:
        return
    import torch.distributed as dist
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    from ..accelerator import get_accelerator
    gc.collect()
    acc, gib = get_accelerator(), 1024**3
    print(message)
    print(f"MA {round(acc.memory_allocated() / gib, 2)} GB "
          f"Max_MA {round(acc.max_memory_allocated() / gib, 2)} GB "
          f"CA {round(acc.memory_reserved() / gib, 2)} GB "
          f"Max_CA {round(acc.max_memory_reserved() / gib, 2)} GB")
    acc.reset_peak_memory_stats()
