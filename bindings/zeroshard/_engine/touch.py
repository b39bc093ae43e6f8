"""Stage 3: a sharded parameter read anywhere is read whole.

Between uses a stage-3 parameter holds no values of its own (its unit's shard is
elsewhere). Its unit is gathered where one of the unit's modules runs (the engine's
module hooks), but code also reads parameters outside their modules: a head that
multiplies by the embedding's weight, a loss reading get_input_embeddings().weight,
logging a norm between steps. Every parameter the engine shards therefore gets a class of
its own, a subclass of its class whose __torch_function__ sees each operation that reads
it and has its unit gathered first (ParamCoordinator::touch, sharding/ParamCoordinator.h):

- inside forward or backward the unit is gathered in the schedule's order, and kept until
  backward ends where autograd recorded the read (it reads the values again there);
- outside them (between steps) the read is a collective over a group of its own: every
  rank makes the same reads in the same order, as with gathered_parameters. One unit is
  held at a time, until the next read of another unit, the next forward or the step, so
  results that share its memory (a view, detach(), .data) are copied before they are
  returned, and in-place writes are refused: they would be lost when the unit goes
  (engine.gathered_parameters(module, modifier_rank=...) writes parameters).

Operations that read no values (shape, dtype, .grad, requires_grad_) gather nothing, and
printing a parameter that is not gathered says so instead of gathering."""
import weakref

import torch

from .. import _zeroshard

# Tensor attributes and methods that read no values: a sharded parameter answers them as
# it is (zeroshard.init's construction uses the same set).
METADATA = {
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.nelement,
    torch.Tensor.is_floating_point, torch.Tensor.is_complex, torch.Tensor.element_size,
    torch.Tensor.requires_grad_, torch.Tensor.data_ptr, torch.Tensor.__hash__,
    torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.stride,
    torch.Tensor.is_contiguous, torch.Tensor.get_device, torch.Tensor.__len__,
    torch.Tensor.register_hook, torch.Tensor.retain_grad, torch.Tensor.untyped_storage,
} | {getattr(torch.Tensor, name).__get__ for name in (
    "shape", "dtype", "device", "layout", "ndim", "requires_grad", "is_leaf", "grad",
    "grad_fn", "is_meta", "is_cuda", "is_sparse", "names", "itemsize", "nbytes")
} | {getattr(torch.Tensor, name).__set__ for name in ("grad", "requires_grad")
} | {torch.Tensor.grad.__delete__}
if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
    METADATA.add(torch.Tensor.register_post_accumulate_grad_hook)

_NOT_HELD, _FOR_USE, _FOR_READ = 0, 1, 2  # ParamCoordinator::Held
_classes = {}  # a parameter class -> its sharded subclass


class _Sharded:
    """Mixed in before a parameter's class (engine_parameters below)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        read = [] if func in METADATA else _held_for_read(args, kwargs)
        if read and _writes(func, args, kwargs):
            name = read[0]._zs_name
            raise _zeroshard.Error(
                f"parameter '{name}' is sharded (ZeRO stage 3) and {func.__name__} would write "
                "it outside training, where it is whole only to be read: write it inside "
                "`with engine.gathered_parameters(module, modifier_rank=0):`")
        out = super().__torch_function__(func, types, args, kwargs)
        return _copies(out, read) if read else out

    def __repr__(self):
        units = self._zs_units()
        if units is not None and units.engine.unit_held(self._zs_unit) == _NOT_HELD:
            return (f"Parameter '{self._zs_name}' of shape {tuple(self.shape)}, {self.dtype}, "
                    "sharded across ranks (ZeRO stage 3): gathered when an operation reads it")
        return super().__repr__()


def _sharded_in(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, _Sharded):
                yield t


def _held_for_read(args, kwargs):
    """Tells the engine of every sharded parameter the operation reads (its unit is
    gathered where it is not there); returns those held only for a read (outside forward
    and backward)."""
    read = []
    for p in _sharded_in(args, kwargs):
        units = p._zs_units()
        if units is None or units.running[p._zs_unit]:  # the engine gone; inside the unit
            continue
        if units.engine.touch_unit(p._zs_unit, torch.is_grad_enabled()) == _FOR_READ:
            read.append(p)
    return read


def _writes(func, args, kwargs):
    """In place on a sharded parameter: add_, copy_, p[i] = x, p += x, p.data = x, out=p."""
    name = getattr(func, "__name__", "")
    in_place = (name.endswith("_") and not name.endswith("__")) or name == "__setitem__" or (
        name.startswith("__i") and name.endswith("__")) or func is _SET_DATA
    return (in_place and bool(args) and isinstance(args[0], _Sharded)) or isinstance(
        kwargs.get("out"), _Sharded)


_SET_DATA = torch.Tensor.data.__set__


def _storage(t):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (sparse, nested)
        return None


def _copies(out, read):
    """Results sharing memory with a unit held for a read, copied: the unit goes soon."""
    held = {_storage(p) for p in read}
    if isinstance(out, torch.Tensor) and _storage(out) in held:
        with torch._C.DisableTorchFunctionSubclass():
            return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_copies(o, read) for o in out)
    return out


class Units:
    """What the reads of sharded parameters ask: the C++ engine, and which units' modules
    are running now (the engine's module hooks count them), inside which a read is the
    unit's own and asks nothing. The ZeroShardEngine holds it; parameters hold it weakly."""

    def __init__(self, engine, count):
        self.engine = engine
        self.running = [0] * count


def shard_parameters(units, params_of_units):
    """Gives every parameter of `params_of_units` ([(modules, [(name, parameter)])]) the
    sharded class of its class, answering to `units` (a Units)."""
    owner = weakref.ref(units)
    for index, (_, params) in enumerate(params_of_units):
        for name, p in params:
            base = type(p)
            if not issubclass(base, _Sharded):  # else an engine before this one gave it
                sharded = _classes.get(base)
                if sharded is None:
                    sharded = _classes[base] = type(f"Sharded{base.__name__}", (_Sharded, base),
                                                    {})
                p.__class__ = sharded
            p._zs_units, p._zs_unit, p._zs_name = owner, index, name
