"""Where the engine trains: on a GPU process, this rank's GPU, as DeepSpeed's engine places
a model it is given (`module.to(cuda:LOCAL_RANK)` unless zero.Init placed it). The engine
trains where the parameters are, so a model the script built on the host is moved here
first; one the script put on a GPU stays there (ranks sharing one GPU put it there
themselves). Placeholders (zeroshard.init's shards, meta parameters) are made on the GPU
instead, one element each, so the engine builds its buffers there and copies each group
up as it materializes it. The accelerator is DeepSpeed's: DS_ACCELERATOR=cpu keeps a
model on the host where a GPU is visible; a front-end's own choice (accelerate's
`Accelerator(cpu=True)`, the Trainer's `use_cpu`, Lightning's `accelerator="cpu"`) is
given as `chosen(device)` around its initialize and wins."""
import contextlib

import torch

from .. import _zeroshard
from .._common import devices
from .param_shards import is_sharded, poison


def target_device(accelerator, local_rank, device_count):
    """The device a host-built model goes to: None on the CPU accelerator, else
    cuda:LOCAL_RANK, which must be a GPU this process sees."""
    if accelerator != "cuda":
        return None
    if local_rank >= device_count:
        raise _zeroshard.Error(
            f"zeroshard.initialize: LOCAL_RANK is {local_rank} and this process sees "
            f"{device_count} GPU(s), so the model built on the host has no cuda:{local_rank} "
            f"to go to; allowed: LOCAL_RANK below {device_count} (one rank per GPU), or the "
            "model moved to a GPU by the script before initialize (ranks sharing one GPU, "
            "with ZS_DIST_BACKEND=gloo), or DS_ACCELERATOR=cpu to train on the host")
    return torch.device("cuda", local_rank)


_chosen = []  # the devices front-ends chose, the innermost last


@contextlib.contextmanager
def chosen(device):
    """Inside: a host-built model goes to `device` (a front-end's: accelerate's
    accelerator.device, the Trainer's args.device, Lightning's root_device), not to the
    accelerator's GPU; a CPU device keeps it on the host."""
    _chosen.append(torch.device(device))
    try:
        yield
    finally:
        _chosen.pop()


def _accelerator_target():
    name = devices.accelerator_name()
    if name != "cuda":
        return None
    return target_device(name, _zeroshard.launch_env()["local_rank"], torch.cuda.device_count())


def place(model):
    """Moves a host-built model to this rank's GPU (see the module's docstring). Returns
    the device its placeholders are to be made on (None: where they are)."""
    params = list(model.parameters())
    if not params or any(p.device.type not in ("cpu", "meta") for p in params):
        return None  # on a device already: the script's placement
    from torch.distributed.tensor import DTensor
    if any(isinstance(p, DTensor) for p in params):
        return None  # the mesh's device type says where
    target = _chosen[-1] if _chosen else _accelerator_target()
    if target is None or target.type != "cuda":
        return None
    torch.cuda.set_device(target)
    with torch.no_grad():
        for p in params:
            if p.is_meta:
                continue  # made on the target by the materializer
            if is_sharded(p):  # gathered on the host, then moved (_engine/construction.py)
                p.data, p._zs_home = poison(p.shape, p.dtype, target), target
            else:
                p.data = p.data.to(target)
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None and not buffer.is_meta:
                    module._buffers[name] = buffer.to(target)
    return target
