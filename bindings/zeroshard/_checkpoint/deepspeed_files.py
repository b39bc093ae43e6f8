"""DeepSpeed's rank files as the converter (_checkpoint/deepspeed_checkpoint.py) reads them: which
files a checkpoint folder has, each loaded without running anything it names
(_checkpoint/safe_load.py), and the layout they describe checked against the data they hold before
anything is sized by it. What a malformed file raises is said as the folder's Error
(MALFORMED); tests/fuzz/fuzz_deepspeed_checkpoint.py holds the reader to that."""
import math
import os
import re
import zipfile

import torch

from . import safe_load as _safe_load
from .. import _zeroshard


def error(message):
    return _zeroshard.Error(f"DeepSpeed checkpoint: {message}")


def rank_files(folder, suffix):
    pattern = re.compile(r"zero_pp_rank_(\d+)_mp_rank_00" + re.escape(suffix) + "$")
    found = {int(m.group(1)): os.path.join(folder, n) for n in os.listdir(folder)
             if (m := pattern.match(n))}
    if sorted(found) != list(range(len(found))) or not found:
        raise error(f"'{folder}': rank files *{suffix} are missing or not numbered 0..N-1 "
                    f"(found ranks {sorted(found)})")
    return [found[r] for r in range(len(found))]


def _is_zip(path):
    try:  # zipfile's own check raises on some damaged end records
        return zipfile.is_zipfile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def loader(trust):
    """Reads one rank file: restricted unpickling (_checkpoint/safe_load.py: tensors, plain values and
    DeepSpeed's few own types, never a callable the file names) unless trusted, and only
    torch.save's zip format, which DeepSpeed writes (the legacy format sizes its storages
    from the file before reading them)."""
    def load(path):
        if not trust and not _is_zip(path):
            raise error(f"'{path}' is not in torch.save's zip format, which DeepSpeed writes")
        with torch.no_grad():
            loaded = _safe_load.load(path, f"DeepSpeed checkpoint file '{path}'", trust,
                                     TRUST)
        if not isinstance(loaded, dict):
            raise error(f"'{path}' holds a {type(loaded).__name__}, not DeepSpeed's dict of state")
        return loaded
    return load


TRUST = ("zeroshard.convert_deepspeed_checkpoint(DS_DIR, OUT, trust_checkpoint=True), then "
         "load OUT")


def check_shape(name, shape):
    """A parameter's name and shape as the files give them, checked: a str, and dimensions
    that are ints >= 0."""
    if not isinstance(name, str):
        raise error(f"a parameter's name is a {type(name).__name__}; allowed: a str")
    if not isinstance(shape, (torch.Size, list, tuple)) or not all(
            isinstance(d, int) and d >= 0 for d in shape):
        raise error(f"parameter '{name}' has shape {shape!r}; allowed: a list of ints >= 0")
    return shape


def check_covered(what, needed, held):
    """The parameters' shapes ask for `needed` elements of a rank's partition, which holds
    `held`: more would be read past the data (and size the output by the shapes alone)."""
    if needed > held:
        raise error(f"{what}: the parameters' shapes need {needed} elements of its "
                    f"partition, which holds {held}")


def check_frozen(model_state, frozen, params_sharded, world):
    """The frozen parameters' data, before the output is sized by their shapes: whole in
    the model file at stages 1-2 (exactly their elements), a piece per rank at stage 3
    (rank 0's here, every other rank's as it is read)."""
    for name, shape in frozen.items():
        n = math.prod(shape)
        if params_sharded:
            held = model_state["frozen_param_fragments"][name].numel()
            check_covered(f"frozen '{name}', rank 0's piece", min(math.ceil(n / world), n), held)
        elif model_state["module"][name].numel() != n:
            raise error(f"frozen '{name}' has shape {list(shape)} ({n} elements); the model "
                        f"file holds {model_state['module'][name].numel()}")


def check_layout(model_state, flat, paddings, world, ep):
    """Stages 1-2: rank 0's partition holds what the parameters' shapes ask of it, before
    the output is sized by those shapes (every other rank's is checked as it is read). ep:
    each group's expert-parallel size (1 for a dense group)."""
    for g, shapes in enumerate(model_state["param_shapes"]):
        needed, _ = _group_elements(shapes, paddings[g] if paddings else None)
        # DeepSpeed cuts each group (each coordinate's experts) into partitions of one size.
        count = world // ep[g]
        check_covered(f"group {g} (x {count} ranks)", needed, count * flat[g].numel())


def check_groups_covered(model_state, group_starts, paddings):
    """Stages 1-2, after every rank: the ranks' partitions of each group (of each
    coordinate's experts), one after the other, reach its last parameter's end (a short one
    would leave zeros in its place)."""
    for g, shapes in enumerate(model_state["param_shapes"]):
        needed, last_padding = _group_elements(shapes, paddings[g] if paddings else None)
        for c, start in enumerate(group_starts[g]):
            check_covered(f"group {g}{f', coordinate {c}' if c else ''}, every rank's partition "
                          "together", needed - last_padding, start)


def _group_elements(shapes, paddings):
    """A stage 1-2 group's elements in its flat partitions (every parameter with the
    alignment padding after it), and its last parameter's padding."""
    pads = [paddings[i] for i in range(len(shapes))] if paddings else [0] * len(shapes)
    return sum(math.prod(s) + p for s, p in zip(shapes.values(), pads)), (pads[-1] if pads else 0)


# What malformed content raises where the layout is read (a missing key, a value of
# another type, a range past a tensor's end): said as the folder's error, not as a trace.
MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError,
              OverflowError, ZeroDivisionError)
