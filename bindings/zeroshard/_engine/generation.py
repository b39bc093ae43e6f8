"""Hugging Face's generate at stage 3: several ranks kept in step.

Each forward at stage 3 gathers units with every other rank, so a rank whose sequences
end first must go on running forwards (without using them) until every rank's have
ended; without that the ranks' gathers stop matching and they wait on each other for
ever. Hugging Face's synced_gpus does it, over torch.distributed, and turns it on by
itself only under DeepSpeed's ZeRO-3 and FSDP."""
import functools

import torch

from .. import _zeroshard


def syncs(model, loaded):
    """Whether `model`'s generate will keep several ranks in step, so torch.distributed
    must be started (before the engine, at the launch's rendezvous)."""
    if not callable(getattr(model, "generate", None)) or _zeroshard.launch_env()["world_size"] == 1:
        return False
    return loaded.stage in (3, None)  # None: the Planner may pick 3


def sync_generate(model, world_size):
    """model.generate with synced_gpus on by default on more than one rank; an explicit
    synced_gpus is the caller's."""
    generate = getattr(model, "generate", None)
    if not callable(generate) or world_size == 1:
        return

    @functools.wraps(generate)
    def synced(*args, synced_gpus=None, **kwargs):
        if synced_gpus is None:  # torch.distributed started before the engine
            synced_gpus = torch.distributed.is_initialized()
        return generate(*args, synced_gpus=synced_gpus, **kwargs)

    model.generate = synced
