"""Reading pickled files zeroshard did not just write (a DeepSpeed checkpoint's rank files,
the Lightning or Fabric state inside a checkpoint's manifest) without running what they
say: torch.load with weights_only, which rebuilds tensors, containers and plain values
and refuses every other global by name before calling it. Unrestricted unpickling runs
any callable a file names (a `__reduce__` payload), in every rank that loads it.

A few foreign types really occur in those files; each is rebuilt as a stand-in that
keeps its attributes and runs nothing, so DeepSpeed need not be installed to read them:
- DeepSpeed's loss scalers (stages 1-3 pickle the object itself into the optimizer
  file): a ForeignObject holding cur_scale, dynamic, ... as attributes;
- its ZeroStageEnum: the stage's int;
- its fragment_address (stages 1-2's param_slice_mappings): a ForeignObject;
- argparse.Namespace (Megatron-style scripts keep their arguments in client_state) and
  pathlib's posix paths (Lightning's hyper-parameters often hold one): the real classes,
  which only set attributes or join strings;
- numpy's arrays, scalars and dtypes (DeepSpeed's curriculum data sampler keeps numpy's
  RNG state): the functions numpy pickles them with.
What else a file holds is refused with a zeroshard.Error naming the file, the types and
the two knowing ways past: torch.serialization.add_safe_globals([T]) for a type one
trusts, or trust=True for a file one trusts (what a public call takes for it:
convert_deepspeed_checkpoint's trust_checkpoint=True, Lightning's weights_only=False).
"""
import argparse
import io
import pathlib
import pickle
import re

import torch

from .. import _zeroshard


class ForeignObject:
    """Another library's object, rebuilt as its attributes alone."""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots), as pickle's
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"a foreign object's state is a "
                                         f"{type(state).__name__}, not its attributes")
        self.__dict__.update(state)

    def __repr__(self):
        return f"ForeignObject({self.__dict__})"


def _enum_value(value):
    """An enum pickled by value (DeepSpeed's ZeroStageEnum is an int enum)."""
    if not isinstance(value, (int, str)):
        raise pickle.UnpicklingError(f"an enum's value is a {type(value).__name__}")
    return value


def _numpy_types():
    """numpy's arrays, scalars and dtypes (DeepSpeed's data sampler keeps numpy's RNG state):
    the functions numpy pickles them with build an array, a scalar or a dtype, nothing
    else. Under numpy 1's names and numpy 2's."""
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    found = [(np.ndarray, "numpy.ndarray"), (np.dtype, "numpy.dtype")]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found += [(core.multiarray._reconstruct, f"{module}._reconstruct"),
                  (core.multiarray.scalar, f"{module}.scalar")]
    dtypes = getattr(np, "dtypes", None)  # numpy >= 1.25: a class per dtype, which BUILD meets
    for name in getattr(dtypes, "__all__", []):
        found.append((getattr(dtypes, name), f"numpy.dtypes.{name}"))
    return found


# (stand-in, the name a file gives the type): torch.load looks the name up, never imports it.
FOREIGN_TYPES = [
    (ForeignObject, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (ForeignObject, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (ForeignObject, "deepspeed.utils.tensor_fragment.fragment_address"),
    (_enum_value, "deepspeed.runtime.zero.config.ZeroStageEnum"),
    (argparse.Namespace, "argparse.Namespace"),
    (pathlib.PosixPath, "pathlib.PosixPath"),
    (pathlib.PurePosixPath, "pathlib.PurePosixPath"),
] + _numpy_types()


FOREIGN_NAMES = {name for _, name in FOREIGN_TYPES}


def allowed_types():
    """What restricted loading rebuilds, in words, for error messages."""
    return ("tensors, containers, plain values, numpy arrays, argparse.Namespace, "
            "pathlib paths and DeepSpeed's " +
            ", ".join(name.rsplit(".", 1)[1] for _, name in FOREIGN_TYPES
                      if name.startswith("deepspeed.")))


def _unsafe_globals(source):
    """The globals a file names that restricted loading would refuse (read, never run)."""
    try:
        if hasattr(source, "seek"):
            source.seek(0)
        return torch.serialization.get_unsafe_globals_in_checkpoint(source)
    except Exception:  # a file torch cannot even list: the load's own error says why
        return []


def load(source, name, trust=False, how_to_trust="trust_checkpoint=True"):
    """The object pickled in `source` (a path or a binary file), restricted as above;
    `name` says in an error which file it was, `how_to_trust` what the caller passes to
    read a file it trusts."""
    try:
        if trust:
            return torch.load(source, map_location="cpu", weights_only=False)
        with torch.serialization.safe_globals(FOREIGN_TYPES):
            return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        refused = [] if trust else sorted(set(_unsafe_globals(source)) - FOREIGN_NAMES)
        if not refused:  # not a refusal: a file torch's restricted reader cannot parse
            reason = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", str(e))
            raise _zeroshard.Error(f"{name}: not a file torch.load reads ("
                                   f"{reason.group(1) if reason else str(e).splitlines()[0]})"
                                   ) from None
        raise _zeroshard.Error(
            f"{name}: holds {', '.join(refused)}; zeroshard does not unpickle objects from a "
            "file it did not write, since unpickling runs what the file says. Allowed: "
            f"{allowed_types()}. If you trust this file: {how_to_trust}; to allow one type "
            "knowingly: torch.serialization.add_safe_globals([T])") from None
    except Exception as e:
        raise _zeroshard.Error(f"{name}: not a file torch.load reads "
                               f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                               ) from None


def check_loadable(data, whose):
    """At save time: raises where the pickled `data` a checkpoint is about to keep would
    not load back restricted, naming what in it would not (`whose` state it was)."""
    try:
        load(io.BytesIO(data), whose)
    except _zeroshard.Error:
        refused = sorted(set(_unsafe_globals(io.BytesIO(data))) - FOREIGN_NAMES)
        raise _zeroshard.Error(
            f"{whose} holds {', '.join(refused) or 'objects restricted loading refuses'}, "
            "which a checkpoint keeps only if it loads back without running code. Allowed: "
            f"{allowed_types()}; a type you trust: torch.serialization.add_safe_globals([T]) "
            "before saving and before loading") from None
