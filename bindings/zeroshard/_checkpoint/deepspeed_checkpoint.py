"""DeepSpeed checkpoints in: zeroshard.convert_deepspeed_checkpoint(DS_DIR, OUT) reads
what DeepSpeed's save_checkpoint wrote (ZeRO stages 1-3: its `latest` file, the
global_stepN/ folder, one model-states file and one optimizer-states file per rank) and
writes a zeroshard checkpoint of the same training state: every parameter's fp32 master
weights and optimizer state (Adam's moments, SGD's momentum, any per-element state by
its name, and per group the step count and the other scalars), frozen parameters,
persistent buffers, the step counts and the client_state. engine.load_checkpoint(DS_DIR)
converts on the fly, so a DeepSpeed run resumes here at any world size (zeroshard's
checkpoints reshard on load); with DeepSpeed's MoE layer (deepspeed_experts.py) and a
Hugging Face model's experts split by its AutoEP (deepspeed_autoep.py, ZeRO 1-2) at any
ep size too.

Design notes.
- DeepSpeed's layouts, as its own zero_to_fp32 reads them. Stages 1-2: per parameter
  group one flat fp32 vector, cut into one contiguous partition per rank
  (single_partition_of_fp32_groups), parameters one after the other in param_shapes'
  order with param_alignment_paddings between them; the base optimizer's per-element
  state (exp_avg and exp_avg_sq for Adam) is flat in the same layout (the last rank's
  may carry group_paddings).
  Stage 3: every parameter is cut into world-size pieces of ceil(numel / world), each
  rank's pieces one after the other in its fp32_flat_groups (sub-groups concatenated),
  and its optimizer state likewise.
- The output has world size 1: one trainable group holding every trainable parameter,
  one frozen group, then the RNG state and the buffers (engine/Checkpoint.h). Loading
  re-slices it for the engine's world size and stage.
- Memory: one DeepSpeed rank file at a time. The output's layout is known from rank
  0's files (every parameter's shape, the state's names), so each rank's pieces are
  written in place (pwrite) where they belong, then the file is dropped; the CRC-32 is
  read back in 4 MB pieces. Converting a 2-rank stage-3 checkpoint of 2 x 50 MB grows
  the process by 51 MB (the whole state held at once took 404 MB).
- The optimizer the engine resumes with must keep the same state arrays (the engine's
  load refuses others naming both). fp16's dynamic loss scale comes over (scale,
  hysteresis, iteration, last overflow: the same rule on both sides); data-sampler state
  does not.
"""
import json
import math
import os
import shutil
import tempfile
import zlib

import torch

from . import deepspeed_experts as _experts
from . import deepspeed_files as _files
from .. import _zeroshard
from .deepspeed_files import error as _error

# DeepSpeed's own keys in a model-states file; every other key is client_state.
_DS_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
            "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler",
            "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps",
            "global_samples", "dp_world_size", "mp_world_size",
            "checkpoint_parallel_dimensions", "ds_config", "ds_version"}
_GROUP_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def folder_of(ds_dir, tag=None):
    """DS_DIR/TAG (TAG from DS_DIR/latest when None) where it is a DeepSpeed checkpoint
    folder, else None."""
    if tag is None:
        latest = os.path.join(ds_dir, "latest")
        if not os.path.isfile(latest):
            return None
        with open(latest) as f:
            tag = f.read().strip()
    folder = os.path.join(ds_dir, tag)
    if not os.path.isdir(folder) or not any(n.endswith("_optim_states.pt")
                                            for n in os.listdir(folder)):
        return None
    return folder


def _scalar(key, value):
    """A per-group scalar of the optimizer's state, as zeroshard's manifest keeps it
    (bindings/zeroshard/_engine/torch_optimizer.py reads it back); a step count as torch.optim
    keeps it, a float32 tensor (DeepSpeed's own optimizers count in ints)."""
    if isinstance(value, torch.Tensor):
        return {"value": value.item(), "dtype": str(value.dtype).replace("torch.", "")}
    if key == "step":
        return {"value": float(value), "dtype": "float32"}
    return {"value": value}


def _optimizer_state(optim_state, numels):
    """(names, arrays, steps, scalars) of a base optimizer's state: the names of its
    per-element tensors (Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer, ...),
    arrays[g][name] flat fp32 for each flat group g (numels[g] elements: the group's
    partition), and per group its step count and its other scalars."""
    state = optim_state["state"] if isinstance(optim_state, dict) else dict(enumerate(optim_state))
    names, arrays, steps, scalars = None, [], [], []
    for g, i in enumerate(sorted(state)):
        s = state[i]
        mine = [k for k, v in s.items()
                if isinstance(v, torch.Tensor) and v.numel() >= numels[g] > 0]
        if names is None:
            names = mine
        elif mine != names:
            raise _error(f"flat group {g} keeps optimizer state {mine}, group 0 {names}; "
                         "zeroshard keeps the same arrays for every group")
        arrays.append({k: s[k].float().reshape(-1) for k in mine})
        steps.append(int(s.get("step", 0)))
        scalars.append({k: _scalar(k, v) for k, v in s.items() if k not in mine})
    return names or [], arrays, steps, scalars


class _Output:
    """rank0.bin of the converted checkpoint, written in place as DeepSpeed's rank files
    are read one at a time: the trainable group's arrays (master, then each state array,
    every trainable parameter one after the other in param_shapes' order), the frozen
    group, the RNG state and the buffers (engine/Checkpoint.h's layout, world size 1)."""

    def __init__(self, path, trainable, frozen, frozen_dtype, arrays):
        self.trainable, self.frozen, self.arrays = trainable, frozen, arrays
        self.at, numel = {}, 0
        for name, shape in trainable.items():
            self.at[name] = numel
            numel += math.prod(shape)
        self.numel = numel
        self.frozen_at, frozen_numel = {}, 0
        for name, shape in frozen.items():
            self.frozen_at[name] = frozen_numel
            frozen_numel += math.prod(shape)
        self.frozen_dtype = frozen_dtype
        self.frozen_offset = arrays * 4 * numel
        self.size = self.frozen_offset + frozen_numel * (
            frozen_dtype.itemsize if frozen else 0)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise

    def _write(self, values, offset):
        """values (a 1-D tensor) at byte `offset`, without a copy where it is contiguous."""
        raw = memoryview(values.detach().contiguous().view(torch.uint8).numpy())
        while raw:
            done = os.pwrite(self.fd, raw, offset)
            raw, offset = raw[done:], offset + done

    def trained(self, name, begin, columns):
        """Elements [begin, begin + n) of parameter `name` of each array: columns[k] is
        array k's n values (k = 0 the master)."""
        for k, values in enumerate(columns):
            self._write(values.float(), 4 * (k * self.numel + self.at[name] + begin))

    def frozen_part(self, name, begin, values):
        at = self.frozen_offset + (self.frozen_at[name] + begin) * self.frozen_dtype.itemsize
        self._write(values.to(self.frozen_dtype), at)

    def append(self, raw):
        """Bytes after everything so far; returns their offset."""
        offset = self.size
        os.pwrite(self.fd, raw, offset)
        self.size += len(raw)
        return offset

    def close(self):
        """The file's CRC-32, read back in pieces."""
        os.fsync(self.fd)
        crc, offset = 0, 0
        while offset < self.size:
            chunk = os.pread(self.fd, min(4 << 20, self.size - offset), offset)
            crc, offset = zlib.crc32(chunk, crc), offset + len(chunk)
        os.close(self.fd)
        return crc & 0xFFFFFFFF


def _write_stage12(out, optim, group_starts, layouts, rank):
    """One rank's partition of each parameter group (stages 1-2): its part of every
    parameter the partition's range covers (of its coordinate's experts in an expert
    group: group_starts[g][c] is where coordinate c's next partition starts)."""
    flat = optim["single_partition_of_fp32_groups"]
    numels = [t.numel() for t in flat]
    names, arrays, steps, scalars = _optimizer_state(optim["base_optimizer_state"], numels)
    paddings = optim.get("param_alignment_paddings")
    for g, starts in enumerate(group_starts):
        place = layouts.coordinate(g, rank)
        start, end, offset = starts[place], starts[place] + numels[g], 0
        columns = [flat[g].reshape(-1)] + [arrays[g][n][:numels[g]] for n in names]
        for i, (name, shape) in enumerate(layouts.shapes[g][place].items()):
            n = math.prod(shape)
            lo, hi = max(start, offset), min(end, offset + n)
            if lo < hi:
                layouts.write(out, place, name, lo - offset,
                              [c.narrow(0, lo - start, hi - lo) for c in columns])
            offset += n + (paddings[g][i] if paddings else 0)
        starts[place] = end
    return names, steps, scalars


def _write_stage3(out, optim, rank, layouts, model_state):
    """One rank's piece of every parameter (stage 3): ceil(numel / world) elements each
    (AutoEP's experts: per coordinate, layouts.piece), one after the other in its
    fp32_flat_groups (sub-groups concatenated)."""
    flat = optim["fp32_flat_groups"]
    layouts.check(optim, rank)
    _files.check_covered(f"rank {rank}", layouts.needed(),
                         sum(t.numel() for t in flat))
    names, arrays, steps, scalars = _optimizer_state(optim["optimizer_state_dict"],
                                                     [t.numel() for t in flat])
    columns = [_Pieces([t.float().reshape(-1) for t in flat])]
    columns += [_Pieces([a[n][:t.numel()] for a, t in zip(arrays, flat)]) for n in names]
    offset = 0
    for g, shapes in enumerate(model_state["param_shapes"]):
        place, index, pieces = layouts.piece(g, rank)
        for name, shape in shapes.items():
            n = math.prod(shape)
            piece = math.ceil(n / pieces)
            count = min(piece, n - index * piece)
            if count > 0:
                layouts.write(out, place, name, index * piece,
                              [c.narrow(offset, count) for c in columns])
            offset += piece
    return names, steps, scalars


class _Pieces:
    """Tensors one after the other (a rank's sub-groups), read without concatenating
    them: a range inside one is a view of it."""

    def __init__(self, tensors):
        self.tensors, self.starts, at = tensors, [], 0
        for t in tensors:
            self.starts.append(at)
            at += t.numel()

    def narrow(self, offset, count):
        parts = []
        for t, start in zip(self.tensors, self.starts):
            lo, hi = max(offset, start), min(offset + count, start + t.numel())
            if lo < hi:
                parts.append(t.narrow(0, lo - start, hi - lo))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _write_frozen(out, params_sharded, model_files, model_state, load):
    """The parameters DeepSpeed did not train: whole in the model file (stages 1-2), or a
    piece per rank file (stage 3: `params_sharded`), read one file at a time."""
    if not out.frozen:
        return
    if not params_sharded:
        for name in out.frozen:
            out.frozen_part(name, 0, model_state["module"][name].reshape(-1))
        return
    world = len(model_files)
    for rank, path in enumerate(model_files):
        fragments = (model_state if rank == 0 else load(path)).get("frozen_param_fragments")
        for name, shape in out.frozen.items():
            n = math.prod(shape)
            piece = math.ceil(n / world)
            count = min(piece, n - rank * piece)
            if count > 0:
                fragment = fragments[name].reshape(-1)
                _files.check_covered(f"'{path}', frozen '{name}'", count, fragment.numel())
                out.frozen_part(name, rank * piece, fragment[:count])


def _frozen_dtype(params_sharded, model_state):
    shapes = model_state.get("frozen_param_shapes") or {}
    if not shapes:
        return torch.float32
    first = next(iter(shapes))
    if not params_sharded:
        return model_state["module"][first].dtype
    return model_state["frozen_param_fragments"][first].dtype


def _write_all(folder, out_path, load):
    """Writes DeepSpeed's checkpoint FOLDER as OUT_PATH (rank0.bin), one rank file at a
    time; returns what the manifest needs besides the layout."""
    optim_files = _files.rank_files(folder, "_optim_states.pt")
    first = load(optim_files[0])["optimizer_state_dict"]
    stage = int(first["zero_stage"])
    # DeepSpeed's files differ in one way: stage 3 shards the parameters (a model file per
    # rank, pieces of each parameter), stages 1-2 keep them whole.
    params_sharded = stage == 3
    loss_scale = loss_scale_of(first.get("loss_scaler"))
    if params_sharded:
        model_files = _files.rank_files(folder, "_model_states.pt")
    else:
        model_files = [os.path.join(folder, "mp_rank_00_model_states.pt")]
    model_state = load(model_files[0])
    world = len(optim_files)
    # Experts in groups of their own, cut per coordinate: DeepSpeed's MoE layer's and
    # AutoEP's at stages 1-2, AutoEP's at stage 3.
    layouts = (_experts.Stage3Layouts(model_state, world) if params_sharded
               else _experts.GroupLayouts(model_state, first, world))
    trainable = {n: _files.check_shape(n, s) for n, s in layouts.trainable().items()}
    state = first["optimizer_state_dict" if params_sharded else "base_optimizer_state"]
    flat = first["fp32_flat_groups" if params_sharded else "single_partition_of_fp32_groups"]
    names = _optimizer_state(state, [t.numel() for t in flat])[0]
    if params_sharded:
        _files.check_covered("rank 0", layouts.needed(), sum(t.numel() for t in flat))
    else:
        _files.check_layout(model_state, flat, first.get("param_alignment_paddings"), world,
                            layouts.ep)
    del state, flat  # rank 0's file is dropped once written, like every other
    frozen = {n: _files.check_shape(n, s)
              for n, s in (model_state.get("frozen_param_shapes") or {}).items()}
    _files.check_frozen(model_state, frozen, params_sharded, len(model_files))
    layouts.check_frozen(frozen)
    # client_state goes into the manifest (JSON): checked before a byte is written.
    client_state = {k: _jsonable(v, k) for k, v in model_state.items() if k not in _DS_KEYS}
    paddings = first.get("param_alignment_paddings")
    out = _Output(out_path, trainable, frozen, _frozen_dtype(params_sharded, model_state),
                  1 + len(names))
    try:
        step, scalars = 0, None
        group_starts = None if params_sharded else [[0] * ep for ep in layouts.ep]
        for rank, path in enumerate(optim_files):
            optim = first if rank == 0 else load(path)["optimizer_state_dict"]
            got, steps, group_scalars = (
                _write_stage3(out, optim, rank, layouts, model_state) if params_sharded
                else _write_stage12(out, optim, group_starts, layouts, rank))
            if got != names:
                raise _error(f"rank {rank} keeps optimizer state {got}, rank 0 {names}")
            scalars = group_scalars if scalars is None else scalars
            step = max([step] + steps)
            del optim
            first = None
        if not params_sharded:
            _files.check_groups_covered(model_state, group_starts, paddings)
        _write_frozen(out, params_sharded, model_files, model_state, load)
        rng = torch.get_rng_state().numpy().tobytes()
        rng_offset = out.append(rng)
        buffers = []
        for name, t in model_state["module"].items():
            if name in set(model_state.get("buffer_names") or []):
                raw = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                buffers.append({"name": layouts.rename(name),
                                "dtype": str(t.dtype).replace("torch.", ""),
                                "shape": list(t.shape), "offset": out.append(raw),
                                "bytes": len(raw)})
    except BaseException:
        os.close(out.fd)
        raise
    crc = out.close()
    config = model_state.get("ds_config") or {}
    accumulation = int(config.get("gradient_accumulation_steps", 1) or 1)
    groups = []
    if trainable:
        groups.append(_group(trainable, out.numel, True, "fp32", 0))
    if frozen:
        groups.append(_group(frozen, sum(math.prod(s) for s in frozen.values()), False,
                             _GROUP_DTYPE[out.frozen_dtype], out.frozen_offset))
    steps = step or int(model_state.get("global_steps", 0))
    # A DeepSpeed scheduler's position: advanced once per applied step (last_batch_iteration
    # starts at -1), which a config scheduler here resumes from.
    scheduler = model_state.get("lr_scheduler")
    advanced = steps
    if isinstance(scheduler, dict) and "last_batch_iteration" in scheduler:
        advanced = int(scheduler["last_batch_iteration"]) + 1
    return {"stage": stage, "optimizer_state": names, "optimizer_scalars": {"groups": scalars},
            "global_steps": int(model_state.get("global_steps", steps)),
            "skipped_steps": int(model_state.get("skipped_steps", 0) or 0),
            "schedule_steps": advanced,
            "aliases": _aliases(model_state),
            "optimizer_steps": steps,
            "micro_steps": int(model_state.get("global_steps", 0)) * accumulation,
            "client_state": client_state, "loss_scale": loss_scale,
            "groups": groups, "rng_offset": rng_offset, "rng_bytes": len(rng),
            "buffers": buffers, "file_bytes": out.size, "crc32": crc}


def loss_scale_of(scaler):
    """fp16's dynamic loss scale as zeroshard's checkpoint keeps it (sharding/LossScaler.h
    follows DeepSpeed's DynamicLossScaler step for step), or None: a static scale (bf16's
    1, or fp16's loss_scale) is the config's to set."""
    if scaler is None or not getattr(scaler, "dynamic", False):
        return None
    return {"scale": float(scaler.cur_scale), "hysteresis_left": int(scaler.cur_hysteresis),
            "iteration": int(scaler.cur_iter), "last_overflow": int(scaler.last_overflow_iter)}


def _jsonable(value, key):
    try:
        json.dumps(value)
        return value
    except TypeError:
        raise _error(f"client_state key '{key}' holds a {type(value).__name__}, which a "
                     "zeroshard checkpoint's manifest (JSON) cannot keep") from None


def write(ds_folder, out_dir, tag, trust=False):
    """A zeroshard checkpoint OUT_DIR/TAG (world size 1) of the DeepSpeed checkpoint in
    DS_FOLDER, streamed: one DeepSpeed rank file in memory at a time. Nothing in the
    files runs (restricted unpickling) unless `trust`."""
    folder = os.path.join(out_dir, tag)
    made = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(folder, "rank0.bin")
    try:
        state = _write_all(ds_folder, data, _files.loader(trust))
    except BaseException as e:  # nothing half-written stays: the data, a folder made here
        if os.path.exists(data):
            os.unlink(data)
        if made and not os.listdir(folder):
            os.rmdir(folder)
        if isinstance(e, _files.MALFORMED) and not isinstance(e, _zeroshard.Error):
            raise _error(f"'{ds_folder}' is not in the layout DeepSpeed writes "
                         f"({type(e).__name__}: {e})") from None
        raise
    manifest = {"format": 1, "tag": tag, "world_size": 1, "stage": state["stage"],
                "optimizer_steps": state["optimizer_steps"], "micro_steps": state["micro_steps"],
                "global_steps": state["global_steps"], "skipped_steps": state["skipped_steps"],
                "schedule_steps": state["schedule_steps"],
                "loss_scale": state["loss_scale"], "param_groups": None, "lr_scheduler": None,
                "optimizer_state": state["optimizer_state"],
                "optimizer_scalars": state["optimizer_scalars"],
                "client_state": state["client_state"],
                "config_yaml": "", "rng_offset": state["rng_offset"],
                "rng_bytes": state["rng_bytes"], "groups": state["groups"],
                "buffers": state["buffers"], "aliases": state["aliases"],
                "files": [{"name": "rank0.bin", "bytes": state["file_bytes"],
                           "crc32": state["crc32"]}]}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    with open(os.path.join(out_dir, "latest"), "w") as f:
        f.write(tag)


def _aliases(model_state):
    """DeepSpeed's shared_params ({alias: the parameter it is}), as names."""
    shared = model_state.get("shared_params") or {}
    if not isinstance(shared, dict) or not all(
            isinstance(a, str) and isinstance(n, str) for a, n in shared.items()):
        raise _error(f"shared_params is {type(shared).__name__} {str(shared)[:80]}; allowed: "
                     "a dict of parameter names")
    return [[a, n] for a, n in shared.items()]


def _group(shapes, numel, trainable, dtype, file_offset):
    params, offset = [], 0
    for name, shape in shapes.items():
        shape = list(shape)
        n = math.prod(shape)
        params.append({"name": name, "shape": shape, "offset": offset, "numel": n})
        offset += n
    return {"shard_numel": numel, "trainable": trainable, "dtype": dtype,
            "file_offset": file_offset, "params": params}


def convert_deepspeed_checkpoint(ds_dir, out_dir, tag=None, trust_checkpoint=False):
    """Writes the DeepSpeed checkpoint DS_DIR (its latest tag, or TAG) as a zeroshard
    checkpoint in OUT_DIR under the same tag; returns the tag. Its files are read without
    running anything they name (tensors, plain values and DeepSpeed's own loss scaler,
    enum and fragment types); trust_checkpoint=True reads them with unrestricted pickle,
    for files you trust that hold other types."""
    folder = folder_of(ds_dir, tag)
    if folder is None:
        raise _error(f"'{ds_dir}' (tag {tag or 'from its latest file'}) holds no DeepSpeed "
                     "checkpoint (global_stepN/ with *_optim_states.pt files)")
    name = os.path.basename(folder)
    write(folder, out_dir, name, trust_checkpoint)
    return name


def loaded_through_conversion(ds_dir, tag, load):
    """load(converted_dir, tag) on a converted copy in a temporary folder (removed after)."""
    tmp = tempfile.mkdtemp(prefix="zeroshard-from-deepspeed-")
    try:
        name = convert_deepspeed_checkpoint(ds_dir, tmp, tag)
        return load(tmp, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
