"""zeroshard.zero: deepspeed.zero's names, so that `deepspeed.zero.Init(...)` and
`deepspeed.zero.GatheredParameters(...)` become `zeroshard.zero.Init(...)` and
`zeroshard.zero.GatheredParameters(...)`."""
import contextlib

import torch

from ._engine import construction as _construction
from . import _zeroshard
from ._engine.construction import Init  # noqa: F401  (deepspeed.zero.Init)
from ._engine.engine import engine_of


@contextlib.contextmanager
def GatheredParameters(params, modifier_rank=None, fwd_module=None, enabled=True):
    """Whole parameters inside the block, on every rank (a collective: every rank enters
    it with the same parameters). With modifier_rank=R, rank R's values when the block
    ends become every rank's (sharded again, the optimizer's fp32 master restarting from
    them); without, values written inside are dropped, as in DeepSpeed. `params`: one
    parameter or an iterable of them, held by an engine, sharded by zeroshard.zero.Init,
    or plain (then nothing needs gathering)."""
    if fwd_module is not None:
        raise _zeroshard.Error(
            "GatheredParameters(fwd_module=...): registering external parameters is not "
            "needed here (a stage-3 unit gathers every parameter its forward touches); "
            "allowed: fwd_module=None")
    if not enabled:
        yield
        return
    if isinstance(params, torch.Tensor):
        params = [params]
    params = [p for p in params if p is not None]
    by_engine, constructed = {}, []
    for p in params:
        engine = engine_of(p)
        if engine is not None:
            by_engine.setdefault(id(engine), (engine, []))[1].append(p)
        elif _construction.is_sharded(p):
            constructed.append(p)
    with contextlib.ExitStack() as stack:
        for engine, mine in by_engine.values():
            stack.enter_context(engine.gathered(mine, modifier_rank))
        if constructed:
            stack.enter_context(_construction.gathered_shards(constructed, modifier_rank))
        yield


_said_external = False


def register_external_parameter(module, parameter):
    """DeepSpeed's declaration that `module`'s forward uses `parameter` of another module.
    Not needed here: a stage-3 parameter read outside its own unit is gathered for that
    read (docs/features.md). Accepted, and said once per process."""
    global _said_external
    if not _said_external:
        _said_external = True
        print("zeroshard: zero.register_external_parameter is not needed (a parameter read "
              "outside its own module is gathered for the read); accepted", flush=True)

