"""zeroshard.consolidate: one ordinary state_dict from a sharded checkpoint, for
torch.load and model.load_state_dict, with tied parameters under every name; or, with
format="safetensors", Hugging Face's layout that from_pretrained loads.

It streams: each parameter is assembled from the rank files' slices with positioned
reads, converted, and added to the output, so beyond the output itself the memory it
needs is one parameter. With per_tensor=True each tensor goes to its own file as soon
as it is assembled (OUT/<name>.pt plus OUT/index.json), for outputs larger than RAM.
With format="safetensors" the memory is one shard (max_shard_size)."""
import json
import math
import os
import shutil
import sys

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _read_manifest(folder):
    path = os.path.join(folder, "manifest.json")
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint manifest '{path}' is missing")
    with open(path) as f:
        return folder, json.load(f)


def _parts(ckpt_dir, tag, stage=None):
    """[[(folder, manifest)]]: a list per pipeline stage (one without a pipeline, or the one
    `stage` names), of one part or one per tensor-parallel rank (engine/Checkpoint.h)."""
    if tag is None:
        latest = os.path.join(ckpt_dir, "latest")
        if not os.path.isfile(latest):
            raise ValueError(f"checkpoint '{ckpt_dir}' has no 'latest' file; give a tag")
        with open(latest) as f:
            tag = f.read().strip()
    folder = os.path.join(ckpt_dir, tag)
    stages = os.path.join(folder, "pipeline.json")
    if not os.path.isfile(stages):
        if stage is not None:
            raise ValueError(f"stage {stage}: checkpoint '{folder}' was not saved by pipeline "
                             "stages; allowed: no stage")
        return [_tensor_parallel_parts(folder)]
    with open(stages) as f:
        size = json.load(f)["pp_size"]
    if stage is not None and not 0 <= stage < size:
        raise ValueError(f"stage {stage}: checkpoint '{folder}' has {size} pipeline stages; "
                         f"allowed: 0 to {size - 1}")
    return [_tensor_parallel_parts(os.path.join(folder, f"pipeline_stage_{s:02d}"))
            for s in (range(size) if stage is None else [stage])]


def _tensor_parallel_parts(folder):
    split = os.path.join(folder, "tensor_parallel.json")
    if os.path.isfile(os.path.join(folder, "manifest.json")) or not os.path.isfile(split):
        return [_read_manifest(folder)]
    with open(split) as f:
        size = json.load(f)["tp_size"]
    return [_read_manifest(os.path.join(folder, f"tp_rank_{t:02d}")) for t in range(size)]


def _assemble(folder, manifest, group, param, files, array=0):
    """Parameter `param` of `group` in fp32 (the master copy for trainable groups; `array`
    k > 0: the optimizer's state array k - 1, stored after the master in each slice)."""
    S = group["shard_numel"]
    trainable = group["trainable"]
    dtype = torch.float32 if trainable else _DTYPES[group["dtype"]]
    elem = torch.tensor([], dtype=dtype).element_size()
    out = torch.empty(param["numel"], dtype=dtype)
    raw = out.view(torch.uint8)
    idx, done = param["offset"], 0
    ranks = group.get("ranks")  # the files of its slices (split experts), else every rank's
    while done < param["numel"]:
        rank, pos = divmod(idx, S)
        rank = ranks[rank] if ranks else rank
        take = min(param["numel"] - done, S - pos)
        files[rank].seek(group["file_offset"] + (array * S + pos) * elem)
        chunk = files[rank].read(take * elem)
        if len(chunk) != take * elem:
            raise ValueError(f"checkpoint file '{files[rank].name}' is truncated "
                             f"(reading '{param['name']}')")
        raw[done * elem:(done + take) * elem] = torch.frombuffer(bytearray(chunk),
                                                                 dtype=torch.uint8)
        idx += take
        done += take
    return out.view(param["shape"]).to(torch.float32)


def _joined(folder, manifest, name, files, array=0):
    """Parameter `name` saved in parts (split fused experts, engine/Checkpoint.h), its parts
    joined end to end into the whole shape; parts that do not make it whole are refused."""
    parts = sorted(((p["whole_offset"], g, p) for g in manifest["groups"] for p in g["params"]
                    if p["name"] == name and "whole_shape" in p), key=lambda t: t[0])
    shape, end, flat = parts[0][2]["whole_shape"], 0, []
    for offset, group, param in parts:
        if offset != end or param["whole_shape"] != shape:
            raise ValueError(f"checkpoint '{folder}': the parts of parameter '{name}' do not make "
                             f"it whole (a part at element {offset} of {shape} where {end} was "
                             "expected): the manifest is damaged")
        flat.append(_assemble(folder, manifest, group, param, files, array).reshape(-1))
        end += param["numel"]
    whole = torch.cat(flat)
    if whole.numel() != math.prod(shape):
        raise ValueError(f"checkpoint '{folder}': the parts of parameter '{name}' end at element "
                         f"{whole.numel()} of {math.prod(shape)}: the manifest is damaged")
    return whole.view(shape)


def _buffer(files, saved):
    """A module buffer rank 0 saved (engine/Checkpoint.h), in its own dtype."""
    files[0].seek(saved["offset"])
    raw = files[0].read(saved["bytes"])
    if len(raw) != saved["bytes"]:
        raise ValueError(f"checkpoint file '{files[0].name}' is truncated (reading buffer "
                         f"'{saved['name']}')")
    flat = (torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw
            else torch.empty(0, dtype=torch.uint8))
    return flat.view(getattr(torch, saved["dtype"])).reshape(saved["shape"]).clone()


def _tensors(stages, dtype):
    """Every stage's tensors (_stage_tensors), in one state_dict: a name two stages both hold
    (stage modules that name their own layers alike) is refused."""
    held = {}
    for index, parts in enumerate(stages):
        for name, aliases, t in _stage_tensors(parts, dtype):
            for n in [name] + aliases:
                if n in held:
                    raise ValueError(
                        f"checkpoint '{os.path.dirname(parts[0][0])}': pipeline stages "
                        f"{held[n]} and {index} both hold '{n}' (each stage's module names its "
                        "own parameters); give stage= (--stage) to consolidate one stage at "
                        "a time")
                held[n] = index
            yield name, aliases, t


def _stage_tensors(parts, dtype):
    """(name, aliases, tensor) for every parameter, one assembled at a time (a
    tensor-parallel one from every tp rank's slice, concatenated along the dimension it
    was split on), then every buffer (in the dtype it was saved in, as a state_dict holds
    it)."""
    opened = [[open(os.path.join(folder, f["name"]), "rb") for f in manifest["files"]]
              for folder, manifest in parts]
    where = [{p["name"]: (g, p) for g in manifest["groups"] for p in g["params"]}
             for _, manifest in parts]
    folder, manifest = parts[0]
    aliases = {}
    for alias, name in manifest.get("aliases", []):
        aliases.setdefault(name, []).append(alias)
    joined = set()
    try:
        for group in manifest["groups"]:
            for param in group["params"]:
                dim = param.get("tensor_parallel_dim", -1)
                if "whole_shape" in param:  # a part: the whole at its first part, then none
                    if param["name"] not in joined:
                        joined.add(param["name"])
                        yield (param["name"], aliases.get(param["name"], []),
                               _joined(folder, manifest, param["name"], opened[0])
                               .to(_DTYPES[dtype]))
                    continue
                if dim < 0 or len(parts) == 1:
                    t = _assemble(folder, manifest, group, param, opened[0])
                else:
                    slices = []
                    for (f, m), files, index in zip(parts, opened, where):
                        if param["name"] not in index:
                            raise ValueError(f"checkpoint '{f}' has no parameter "
                                             f"'{param['name']}' ('{folder}' has it)")
                        g, p = index[param["name"]]
                        slices.append(_assemble(f, m, g, p, files))
                    t = torch.cat(slices, dim=dim)
                yield param["name"], aliases.get(param["name"], []), t.to(_DTYPES[dtype])
        for saved in manifest.get("buffers") or []:
            yield saved["name"], [], _buffer(opened[0], saved)
    finally:
        for files in opened:
            for f in files:
                f.close()


# Hugging Face's file names (transformers' SAFE_WEIGHTS_NAME and its index).
_WEIGHTS, _INDEX = "model.safetensors", "model.safetensors.index.json"


def _is_weights_file(name):
    return name in (_WEIGHTS, _INDEX) or (name.startswith("model-")
                                          and name.endswith(".safetensors"))


def write_into_folder_atomically(target, write):
    """Calls write(tmp) on a new sibling folder, then moves its files into `target`
    one by one (each move atomic), weight shards first and the index and config.json
    last, then removes weight files of an earlier save that the new one did not write.
    Other files in `target` stay. A save that fails leaves `target` as it was."""
    tmp = f"{target.rstrip(os.sep)}.zeroshard-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        write(tmp)
        os.makedirs(target, exist_ok=True)
        written = sorted(os.listdir(tmp), key=lambda n: (n in (_INDEX, "config.json"), n))
        for name in written:
            os.replace(os.path.join(tmp, name), os.path.join(target, name))
        for name in os.listdir(target):
            if _is_weights_file(name) and name not in written:
                os.remove(os.path.join(target, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_safetensors(tensors, folder, max_shard_bytes, hf_config):
    """Shards of at most max_shard_bytes (a larger tensor gets one of its own) named as
    Hugging Face names them, the index when there are several, a copy of the config.json
    hf_config names when given.
    Tied aliases are left out, as Hugging Face leaves them out: from_pretrained ties them
    again (and safetensors refuses one storage under two names)."""
    from safetensors.torch import save_file
    shards, current, size, total = [], {}, 0, 0

    def flush():
        if current:
            path = os.path.join(folder, f"shard-{len(shards)}.tmp")
            save_file(current, path, metadata={"format": "pt"})
            shards.append((path, list(current)))

    for name, _aliases, t in tensors:
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_shard_bytes:
            flush()
            current, size = {}, 0
        current[name] = t
        size += nbytes
        total += nbytes
    flush()
    if len(shards) == 1:
        os.replace(shards[0][0], os.path.join(folder, _WEIGHTS))
    else:
        weight_map = {}
        for i, (path, names) in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            os.replace(path, os.path.join(folder, file))
            weight_map.update((n, file) for n in names)
        with open(os.path.join(folder, _INDEX), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if hf_config is not None:
        shutil.copyfile(hf_config, os.path.join(folder, "config.json"))
    return sum(len(names) for _, names in shards)


def _shard_bytes(max_shard_size):
    if isinstance(max_shard_size, int) and max_shard_size > 0:
        return max_shard_size
    from .. import _zeroshard
    try:
        return _zeroshard.parse_bytes(str(max_shard_size), "max_shard_size")
    except _zeroshard.Error as e:
        raise ValueError(str(e)) from None


FORMATS = ("pt", "safetensors")


def consolidate(ckpt_dir, out, tag=None, dtype="fp32", per_tensor=False, format="pt",
                hf_config=None, max_shard_size="5GB", stage=None):
    """Writes the consolidated state_dict to `out`: a .pt file, or a folder with
    per_tensor=True; with format="safetensors", a folder in Hugging Face's layout
    (safetensors shards of at most max_shard_size, their index, and config.json copied
    from hf_config: a config.json or a folder holding one). A checkpoint of pipeline
    stages gives every stage's parameters together, or with `stage` that stage's alone.
    Returns the number of tensors written."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype '{dtype}' is not allowed; allowed: fp32, bf16, fp16")
    if format not in FORMATS:
        raise ValueError(f"format '{format}' is not allowed; allowed: {', '.join(FORMATS)}")
    if format == "safetensors" and per_tensor:
        raise ValueError("per_tensor is for format 'pt'; safetensors output is sharded by "
                         "max_shard_size instead")
    parts = _parts(ckpt_dir, tag, stage)
    if format == "safetensors":
        limit = _shard_bytes(max_shard_size)
        if hf_config is not None:
            hf_config = os.fspath(hf_config)
            if os.path.isdir(hf_config):
                hf_config = os.path.join(hf_config, "config.json")
            if not os.path.isfile(hf_config):
                raise ValueError(f"hf_config '{hf_config}' is neither a config.json nor a "
                                 "folder holding one")
        count = []
        write_into_folder_atomically(out, lambda tmp: count.append(_write_safetensors(
            _tensors(parts, dtype), tmp, limit, hf_config)))
        return count[0]
    state, index = {}, {}
    if per_tensor:
        os.makedirs(out, exist_ok=True)
    for name, aliases, t in _tensors(parts, dtype):
        if per_tensor:
            file = name + ".pt"
            torch.save(t, os.path.join(out, file))
            for n in [name] + aliases:
                index[n] = file
        else:
            for n in [name] + aliases:
                state[n] = t
    if per_tensor:
        with open(os.path.join(out, "index.json"), "w") as f:
            json.dump(index, f, indent=1)
        return len(index)
    tmp = out + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, out)
    return len(state)


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="zeroshard-consolidate",
                                description="one ordinary state_dict from a sharded checkpoint")
    p.add_argument("ckpt_dir")
    p.add_argument("out", help="OUT.pt, or a folder with --per-tensor or --format safetensors")
    p.add_argument("--tag", help="default: the one CKPT_DIR/latest names")
    p.add_argument("--dtype", default="fp32", choices=sorted(_DTYPES))
    p.add_argument("--per-tensor", action="store_true", help="one file per tensor")
    p.add_argument("--format", default="pt", choices=FORMATS,
                   help="safetensors: Hugging Face's layout, for from_pretrained")
    p.add_argument("--hf-config", help="config.json (or its folder) to copy beside the "
                   "safetensors shards")
    p.add_argument("--max-shard-size", default="5GB", help="safetensors shard size (5GB)")
    p.add_argument("--stage", type=int, help="of a checkpoint of pipeline stages: this "
                   "stage's parameters alone (default: every stage's)")
    a = p.parse_args(argv)
    try:
        n = consolidate(a.ckpt_dir, a.out, a.tag, a.dtype, a.per_tensor, a.format,
                        a.hf_config, a.max_shard_size, a.stage)
    except (ValueError, OSError) as e:
        print(f"zeroshard-consolidate: {e}", file=sys.stderr)
        return 2
    print(f"zeroshard-consolidate: {n} tensors ({a.dtype}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
