"""DeepSpeed checkpoints in: zeroshard.convert_deepspeed_checkpoint(DS_DIR, OUT) reads
what DeepSpeed's save_checkpoint wrote (ZeRO stages 1-3: its `latest` file, the
global_stepN/ folder, one model-states file and one optimizer-states file per rank) and
writes a zeroshard checkpoint of the same training state: every parameter's fp32 master
weights and optimizer state (Adam's moments, SGD's momentum, any per-element state by
its name, and per group the step count and the other scalars), frozen parameters, persistent buffers, the step counts and the
client_state. engine.load_checkpoint(DS_DIR) converts on the fly, so a DeepSpeed run
resumes here at any world size (zeroshard's checkpoints reshard on load).

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
- Memory: the whole model's fp32 master and moments, once (a model that fits the host's
  RAM three times over); each rank's files are read one at a time.
- The optimizer the engine resumes with must keep the same state arrays (the engine's
  load refuses others naming both). fp16's dynamic loss scale comes over (scale,
  hysteresis, iteration, last overflow: the same rule on both sides); data-sampler state
  does not.
"""
import json
import math
import os
import re
import shutil
import tempfile
import zlib

import torch

from . import _zeroshard

# DeepSpeed's own keys in a model-states file; every other key is client_state.
_DS_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
            "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler",
            "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps",
            "global_samples", "dp_world_size", "mp_world_size",
            "checkpoint_parallel_dimensions", "ds_config", "ds_version"}
_GROUP_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _error(message):
    return _zeroshard.Error(f"DeepSpeed checkpoint: {message}")


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


def _rank_files(folder, suffix):
    pattern = re.compile(r"zero_pp_rank_(\d+)_mp_rank_00" + re.escape(suffix) + "$")
    found = {int(m.group(1)): os.path.join(folder, n) for n in os.listdir(folder)
             if (m := pattern.match(n))}
    if sorted(found) != list(range(len(found))) or not found:
        raise _error(f"'{folder}': rank files *{suffix} are missing or not numbered 0..N-1 "
                     f"(found ranks {sorted(found)})")
    return [found[r] for r in range(len(found))]


def _load(path):
    with torch.no_grad():
        return torch.load(path, map_location="cpu", weights_only=False)


def _scalar(key, value):
    """A per-group scalar of the optimizer's state, as zeroshard's manifest keeps it
    (bindings/zeroshard/_torch_optimizer.py reads it back); a step count as torch.optim
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


def _stage12(optim_files, model_state):
    """name -> (master, *state arrays), the state's names and scalars, and the
    optimizer's step, for ZeRO stages 1-2."""
    ranks = [_load(f)["optimizer_state_dict"] for f in optim_files]
    groups = len(ranks[0]["single_partition_of_fp32_groups"])
    read = []
    for r in ranks:
        numels = [t.numel() for t in r["single_partition_of_fp32_groups"]]
        read.append(_optimizer_state(r["base_optimizer_state"], numels))
    names, scalars = read[0][0], read[0][3]
    full, step = [], 0
    for g in range(groups):
        parts = [r["single_partition_of_fp32_groups"][g].float() for r in ranks]
        columns = [parts]
        for name in names:
            columns.append([got[1][g][name][:part.numel()] for got, part in zip(read, parts)])
        step = max([step] + [got[2][g] for got in read])
        full.append([torch.cat(c) for c in columns])
    paddings = ranks[0].get("param_alignment_paddings")
    out = {}
    for g, shapes in enumerate(model_state["param_shapes"]):
        offset = 0
        for i, (name, shape) in enumerate(shapes.items()):
            n = math.prod(shape)
            out[name] = tuple(t.narrow(0, offset, n).view(shape).detach().clone() for t in full[g])
            offset += n + (paddings[g][i] if paddings else 0)
    return out, names, scalars, step


def _stage3(optim_files, model_state):
    """name -> (master, *state arrays), the state's names and scalars, and the
    optimizer's step, for ZeRO stage 3."""
    per_rank, step, names, scalars = [], 0, None, None
    for f in optim_files:
        o = _load(f)["optimizer_state_dict"]
        flat = o["fp32_flat_groups"]
        got, arrays, steps, group_scalars = _optimizer_state(o["optimizer_state_dict"],
                                                              [t.numel() for t in flat])
        names, scalars = (got, group_scalars) if names is None else (names, scalars)
        per_rank.append([torch.cat([t.float().reshape(-1) for t in flat])] +
                        [torch.cat([a[name][:t.numel()] for a, t in zip(arrays, flat)])
                         for name in got])
        step = max([step] + steps)
    world = len(per_rank)
    out, offset = {}, 0
    for shapes in model_state["param_shapes"]:
        for name, shape in shapes.items():
            n = math.prod(shape)
            piece = math.ceil(n / world)
            out[name] = tuple(torch.cat([r[k].narrow(0, offset, piece) for r in per_rank])[:n]
                              .view(shape).detach().clone() for k in range(1 + len(names)))
            offset += piece
    return out, names, scalars, step


def _frozen(stage, model_files, model_state):
    """name -> value of the parameters DeepSpeed did not train."""
    shapes = model_state.get("frozen_param_shapes") or {}
    if not shapes:
        return {}
    if stage <= 2:
        return {n: model_state["module"][n].clone() for n in shapes}
    fragments = [_load(f).get("frozen_param_fragments") or {} for f in model_files]
    return {n: torch.cat([fr[n].reshape(-1) for fr in fragments])[:math.prod(s)].view(s)
            for n, s in shapes.items()}


def read(ds_dir, tag=None):
    """The training state of a DeepSpeed checkpoint, whole, as a dict."""
    folder = folder_of(ds_dir, tag)
    if folder is None:
        raise _error(f"'{ds_dir}' (tag {tag or 'from its latest file'}) holds no DeepSpeed "
                     "checkpoint (global_stepN/ with *_optim_states.pt files)")
    optim_files = _rank_files(folder, "_optim_states.pt")
    first = _load(optim_files[0])["optimizer_state_dict"]
    stage = int(first["zero_stage"])
    if stage == 3:
        model_files = _rank_files(folder, "_model_states.pt")
    else:
        model_files = [os.path.join(folder, "mp_rank_00_model_states.pt")]
    model_state = _load(model_files[0])
    params, names, scalars, step = (_stage3 if stage == 3 else _stage12)(optim_files,
                                                                          model_state)
    buffers = {n: t.clone() for n, t in model_state["module"].items()
               if n in set(model_state.get("buffer_names") or [])}
    config = model_state.get("ds_config") or {}
    accumulation = int(config.get("gradient_accumulation_steps", 1) or 1)
    return {"stage": stage, "world_size": len(optim_files), "params": params,
            "optimizer_state": names, "optimizer_scalars": {"groups": scalars},
            "frozen": _frozen(stage, model_files, model_state), "buffers": buffers,
            "aliases": [[a, s] for a, s in (model_state.get("shared_params") or {}).items()],
            "optimizer_steps": step or int(model_state.get("global_steps", 0)),
            "micro_steps": int(model_state.get("global_steps", 0)) * accumulation,
            "client_state": {k: v for k, v in model_state.items() if k not in _DS_KEYS},
            "lr_scheduler": model_state.get("lr_scheduler"),
            "loss_scale": loss_scale_of(first.get("loss_scaler"))}


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


def write(state, out_dir, tag):
    """A zeroshard checkpoint OUT_DIR/TAG (world size 1) of read()'s state."""
    folder = os.path.join(out_dir, tag)
    os.makedirs(folder, exist_ok=True)
    groups, chunks, at = [], [], 0
    trainable = state["params"]
    if trainable:
        numel = sum(t[0].numel() for t in trainable.values())
        count = 1 + len(state["optimizer_state"])
        arrays = [torch.cat([t[k].reshape(-1) for t in trainable.values()]) for k in range(count)]
        groups.append(_group(trainable, numel, True, "fp32", at))
        chunks += [a.detach().numpy().tobytes() for a in arrays]
        at += count * 4 * numel
    frozen = state["frozen"]
    if frozen:
        dtype = next(iter(frozen.values())).dtype
        numel = sum(t.numel() for t in frozen.values())
        flat = torch.cat([t.to(dtype).reshape(-1) for t in frozen.values()])
        groups.append(_group(frozen, numel, False, _GROUP_DTYPE[dtype], at))
        chunks.append(flat.detach().view(torch.uint8).numpy().tobytes())
        at += flat.numel() * flat.element_size()
    rng = torch.get_rng_state().numpy().tobytes()
    rng_offset = at
    at += len(rng)
    chunks.append(rng)
    buffers = []
    for name, t in state["buffers"].items():
        raw = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        buffers.append({"name": name, "dtype": str(t.dtype).replace("torch.", ""),
                        "shape": list(t.shape), "offset": at, "bytes": len(raw)})
        chunks.append(raw)
        at += len(raw)
    data = b"".join(chunks)
    with open(os.path.join(folder, "rank0.bin"), "wb") as f:
        f.write(data)
    manifest = {"format": 1, "tag": tag, "world_size": 1, "stage": state["stage"],
                "optimizer_steps": state["optimizer_steps"], "micro_steps": state["micro_steps"],
                "loss_scale": state["loss_scale"], "param_groups": None, "lr_scheduler": None,
                "optimizer_state": state["optimizer_state"],
                "optimizer_scalars": state["optimizer_scalars"],
                "client_state": {k: _jsonable(v, k) for k, v in state["client_state"].items()},
                "config_yaml": "", "rng_offset": rng_offset, "rng_bytes": len(rng),
                "groups": groups, "buffers": buffers, "aliases": state["aliases"],
                "files": [{"name": "rank0.bin", "bytes": len(data),
                           "crc32": zlib.crc32(data) & 0xFFFFFFFF}]}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    with open(os.path.join(out_dir, "latest"), "w") as f:
        f.write(tag)


def _group(tensors, numel, trainable, dtype, file_offset):
    params, offset = [], 0
    for name, t in tensors.items():
        shape = list((t[0] if trainable else t).shape)
        n = math.prod(shape)
        params.append({"name": name, "shape": shape, "offset": offset, "numel": n})
        offset += n
    return {"shard_numel": numel, "trainable": trainable, "dtype": dtype,
            "file_offset": file_offset, "params": params}


def convert_deepspeed_checkpoint(ds_dir, out_dir, tag=None):
    """Writes the DeepSpeed checkpoint DS_DIR (its latest tag, or TAG) as a zeroshard
    checkpoint in OUT_DIR under the same tag; returns the tag."""
    folder = folder_of(ds_dir, tag)
    state = read(ds_dir, tag)
    name = os.path.basename(folder)
    write(state, out_dir, name)
    return name


def loaded_through_conversion(ds_dir, tag, load):
    """load(converted_dir, tag) on a converted copy in a temporary folder (removed after)."""
    tmp = tempfile.mkdtemp(prefix="zeroshard-from-deepspeed-")
    try:
        name = convert_deepspeed_checkpoint(ds_dir, tmp, tag)
        return load(tmp, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
