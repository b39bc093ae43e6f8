"""A fuzzer for the DeepSpeed checkpoint reader (zeroshard.convert_deepspeed_checkpoint), the
Python side's counterpart of FuzzTargets.cpp: every input must convert or end in
zeroshard.Error, leaving nothing of a refused conversion behind (no rank0.bin, no open
file); any other exception, a payload that runs, or an input taking over 10 s is a bug,
kept under WORK/crashes-deepspeed/ and reported.

Inputs are checkpoint folders in DeepSpeed's layouts (tests/python/deepspeed_layout.py:
stage 3 and stage 2, 2 ranks, a frozen parameter, a buffer, client_state, DeepSpeed's loss
scaler, enum and fragment addresses pickled under DeepSpeed's own names without
DeepSpeed). Each is mutated at one of three levels: the unpickled state (a key dropped, a
value replaced by one of another type or size, a tensor cut, a payload or an unknown type
put in), the pickle inside a file (bytes flipped, cut or repeated), or the file itself.
Kept regression folders (tests/fuzz/regressions/deepspeed/) replay first.
usage: fuzz_deepspeed_checkpoint.py WORK SECONDS (zeroshard importable: PYTHONPATH)"""
import argparse
import enum
import io
import os
import pathlib
import random
import resource
import shutil
import signal
import sys
import time
import traceback
import types
import warnings
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import deepspeed_layout  # noqa: E402
import zeroshard  # noqa: E402

REGRESSIONS = os.path.join(HERE, "regressions", "deepspeed")
PER_INPUT_SECONDS = 10


def deepspeed_types():
    """Classes pickled under DeepSpeed's module names (modules made here, DeepSpeed never
    imported): what its optimizer files hold besides tensors."""
    made = {}
    for module, names in (("deepspeed.runtime.fp16.loss_scaler",
                           ["LossScaler", "DynamicLossScaler"]),
                          ("deepspeed.utils.tensor_fragment", ["fragment_address"]),
                          ("deepspeed.runtime.zero.config", ["ZeroStageEnum"])):
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        for name in names:
            cls = (enum.IntEnum(name, {"optimizer_states": 1, "gradients": 2, "weights": 3},
                                module=module) if name == "ZeroStageEnum"
                   else type(name, (), {"__module__": module}))
            setattr(sys.modules[module], name, cls)
            made[name] = cls
    return made


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


class Unknown:  # a type no allowlist names
    pass


def seeds(work):
    """Three valid checkpoints (stage 3, stage 2, and stage 1 with an AutoEP layer's
    experts), returned as folders."""
    ds = deepspeed_types()
    scaler = ds["DynamicLossScaler"]()
    scaler.__dict__.update(cur_scale=1024.0, dynamic=True, cur_hysteresis=2, cur_iter=5,
                           last_overflow_iter=1, dtype=torch.float16)
    gen = torch.Generator().manual_seed(0)
    params = [{"a.weight": torch.randn(5, 3, generator=gen),
               "a.bias": torch.randn(5, generator=gen)},
              {"b.weight": torch.randn(7, generator=gen)}]
    extra = {"epoch": 3, "note": "client_state"}
    experts = {f"m.experts.{w}": torch.randn(2, 3, 2, generator=gen) for w in ("w1", "w3")}
    experts["m.experts.w2"] = torch.randn(2, 2, 3, generator=gen)
    autoep = dict(extra, ds_autoep_layers=[{
        "module_path": "m", "num_experts": 2,
        "expert_placement": {"ranks": [{"rank": 0, "experts": [0, 1]}]}}])
    folders = []
    for name, write in (
            ("stage3", lambda f: deepspeed_layout.stage3(
                f, 2, params, {"frozen": torch.randn(4, generator=gen).bfloat16()},
                {"bn.running_mean": torch.zeros(3)}, extra=extra)),
            ("stage2", lambda f: deepspeed_layout.stage12(
                f, 2, params, {"bn.running_mean": torch.zeros(3)}, extra=extra)),
            ("autoep", lambda f: deepspeed_layout.stage12(
                f, 2, [{"m.router.gate.weight": torch.randn(2, 2, generator=gen)}, experts],
                {}, stage=1, extra=autoep, param_groups=[{}, {"moe": True}]))):
        folder = os.path.join(work, "seeds", name)
        shutil.rmtree(folder, ignore_errors=True)
        write(pathlib.Path(folder, "global_step2"))
        for path in rank_files(folder):  # DeepSpeed's own types in its optimizer files
            state = torch.load(path, weights_only=False)
            if "optimizer_state_dict" in state:
                optim = state["optimizer_state_dict"]
                optim["zero_stage"] = ds["ZeroStageEnum"](optim["zero_stage"])
                optim["loss_scaler"] = scaler
                fragment = ds["fragment_address"]()
                fragment.__dict__.update(numel=3, start=0)
                optim["param_slice_mappings"] = [{"a.bias": fragment}]
                torch.save(state, path)
        folders.append(folder)
    return folders


def rank_files(folder):
    inner = os.path.join(folder, "global_step2")
    return sorted(os.path.join(inner, n) for n in os.listdir(inner) if n.endswith(".pt"))


def odd_values(marker, rng):
    return [None, -1, 0, 1, 2 ** 40, -2 ** 63, 1.5, float("nan"), "x", b"\0", [], {}, (), set(),
            [2 ** 40], [-3, 4], torch.Size([10 ** 9]), torch.zeros(0), torch.ones(3),
            torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(4, dtype=torch.int64),
            torch.ones(3, dtype=torch.complex64), argparse.Namespace(x=1), Unknown(),
            Payload(marker), {"state": {}}, [torch.ones(2)], rng.choice([1, 2, 3, 4])]


def paths(node):
    """Every (container, key) inside a state, depth first."""
    items = (node.items() if isinstance(node, dict) else enumerate(node)
             if isinstance(node, list) else ())
    for key, value in list(items):
        yield node, key
        yield from paths(value)


def mutate_state(path, rng, marker):
    state = torch.load(path, weights_only=False)
    places = list(paths(state))
    if not places:
        return
    for _ in range(rng.choice([1, 1, 2, 3])):
        node, key = rng.choice(places)
        value = node[key]
        kind = rng.randrange(4)
        if kind == 0 and isinstance(node, dict):
            del node[key]
            places = list(paths(state))
            if not places:
                break
        elif kind == 1 and isinstance(value, torch.Tensor) and value.numel():
            node[key] = value.reshape(-1)[:rng.randrange(value.numel())]
        elif kind == 2 and isinstance(value, torch.Tensor):
            node[key] = torch.cat([value.reshape(-1), value.reshape(-1)]).to(
                rng.choice([value.dtype, torch.float16, torch.int32]))
        else:
            node[key] = rng.choice(odd_values(marker, rng))
    torch.save(state, path)


def mutate_pickle(path, rng):
    """Bytes of data.pkl inside the zip changed, the zip written again around it."""
    with zipfile.ZipFile(path) as z:
        entries = [(i, z.read(i.filename)) for i in z.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info, data in entries:
            if info.filename.endswith("data.pkl"):
                data = mutate_bytes(data, rng)
            z.writestr(info, data)
    with open(path, "wb") as f:
        f.write(out.getvalue())


def mutate_bytes(data, rng):
    data = bytearray(data)
    for _ in range(rng.choice([1, 2, 4, 8])):
        if not data:
            break
        at = rng.randrange(len(data))
        kind = rng.randrange(4)
        if kind == 0:
            data[at] = rng.randrange(256)
        elif kind == 1:
            del data[at:at + rng.randrange(1, 16)]
        elif kind == 2:
            data[at:at] = data[at:at + rng.randrange(1, 16)]
        else:
            data = data[:at]
    return bytes(data)


def mutate(folder, rng, marker):
    path = rng.choice(rank_files(folder))
    level = rng.randrange(3)
    if level == 0:
        mutate_state(path, rng, marker)
    elif level == 1:
        mutate_pickle(path, rng)
    else:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(mutate_bytes(data, rng))


class InputTimeout(BaseException):
    """Not an Exception: nothing in the reader may catch it and call it a refusal."""


def timeout(*_):
    raise InputTimeout(f"an input took over {PER_INPUT_SECONDS} s")


def open_files():
    return len(os.listdir("/proc/self/fd"))


def convert(folder, out, marker, expect=None):
    """None when the input converted or was refused with zeroshard.Error (expect: only
    "converted" or only "refused" is right), else why not."""
    shutil.rmtree(out, ignore_errors=True)
    files = open_files()
    signal.alarm(PER_INPUT_SECONDS)
    try:
        zeroshard.convert_deepspeed_checkpoint(folder, out)
        problem = "converted, where it should be refused" if expect == "refused" else None
    except zeroshard.Error as e:
        problem = f"refused: {e}" if expect == "converted" else None
        left = [os.path.join(d, f) for d, _, names in os.walk(out) for f in names]
        if left:
            problem = f"refused ({e}) but left {left}"
    except BaseException:  # noqa: B036 (a hang's InputTimeout and every bug alike)
        problem = traceback.format_exc()
    finally:
        signal.alarm(0)
    if open_files() != files:
        problem = f"{open_files() - files} file descriptor(s) left open"
    if os.path.exists(marker):
        os.rmdir(marker)
        problem = "the payload ran: unpickling called os.mkdir"
    return problem


def main():
    work, seconds = sys.argv[1], float(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # torch's warnings on odd pickles and indexing: noise here
    # A pickle may ask for any size of bytearray: past 8 GB more than torch's own mappings,
    # an allocation fails (a MemoryError the reader must turn into its Error) instead of
    # taking the machine's memory.
    mapped = int(next(line for line in open("/proc/self/status")
                      if line.startswith("VmSize:")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (8 << 30), resource.RLIM_INFINITY))
    signal.signal(signal.SIGALRM, timeout)
    marker, out, case = (os.path.join(work, n) for n in ("marker", "out", "case"))
    crashes = os.path.join(work, "crashes-deepspeed")
    if os.path.isdir(REGRESSIONS):  # earlier findings first: each must now end cleanly
        for name in sorted(os.listdir(REGRESSIONS)):
            problem = convert(os.path.join(REGRESSIONS, name), out, marker, expect="refused")
            if problem:
                print(f"fuzz deepspeed: kept regression {name} fails again: FAILED\n{problem}")
                return 1
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    folders, runs, failures, end = seeds(work), 0, 0, time.monotonic() + seconds
    for folder in folders:  # the seeds themselves convert
        problem = convert(folder, out, marker, expect="converted")
        if problem:
            print(f"fuzz deepspeed: seed {folder} does not convert: FAILED\n{problem}")
            return 1
    while time.monotonic() < end:
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(rng.choice(folders), case)
        try:
            mutate(case, rng, marker)
        except (zipfile.BadZipFile, RuntimeError, EOFError):
            continue  # an earlier byte mutation left nothing to mutate at this level
        runs += 1
        problem = convert(case, out, marker)
        if problem:
            failures += 1
            kept = os.path.join(crashes, f"input-{failures}")
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(case, kept)
            print(f"fuzz deepspeed: {kept}:\n{problem}", file=sys.stderr)
    if failures:
        print(f"fuzz deepspeed: FAILED, {failures} of {runs} inputs, kept in {crashes}/")
        return 1
    print(f"fuzz deepspeed: {runs} inputs in {seconds:g} s, no crash, payload or hang")
    return 0


if __name__ == "__main__":
    sys.exit(main())
