"""zeroshard.consolidate: one ordinary state_dict from a sharded checkpoint, for
torch.load and model.load_state_dict, with tied parameters under every name.

It streams: each parameter is assembled from the rank files' slices with positioned
reads, converted, and added to the output, so beyond the output itself the memory it
needs is one parameter. With per_tensor=True each tensor goes to its own file as soon
as it is assembled (OUT/<name>.pt plus OUT/index.json), for outputs larger than RAM."""
import json
import os
import sys

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _manifest(ckpt_dir, tag):
    if tag is None:
        latest = os.path.join(ckpt_dir, "latest")
        if not os.path.isfile(latest):
            raise ValueError(f"checkpoint '{ckpt_dir}' has no 'latest' file; give a tag")
        with open(latest) as f:
            tag = f.read().strip()
    path = os.path.join(ckpt_dir, tag, "manifest.json")
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint manifest '{path}' is missing")
    with open(path) as f:
        return os.path.join(ckpt_dir, tag), json.load(f)


def _assemble(folder, manifest, group, param, files):
    """Parameter `param` of `group` in fp32 (the master copy for trainable groups)."""
    S = group["shard_numel"]
    trainable = group["trainable"]
    dtype = torch.float32 if trainable else _DTYPES[group["dtype"]]
    elem = torch.tensor([], dtype=dtype).element_size()
    out = torch.empty(param["numel"], dtype=dtype)
    raw = out.view(torch.uint8)
    idx, done = param["offset"], 0
    while done < param["numel"]:
        rank, pos = divmod(idx, S)
        take = min(param["numel"] - done, S - pos)
        files[rank].seek(group["file_offset"] + pos * elem)
        chunk = files[rank].read(take * elem)
        if len(chunk) != take * elem:
            raise ValueError(f"checkpoint file '{files[rank].name}' is truncated "
                             f"(reading '{param['name']}')")
        raw[done * elem:(done + take) * elem] = torch.frombuffer(bytearray(chunk), dtype=torch.uint8)
        idx += take
        done += take
    return out.view(param["shape"]).to(torch.float32)


def consolidate(ckpt_dir, out, tag=None, dtype="fp32", per_tensor=False):
    """Writes the consolidated state_dict to `out` (a .pt file, or a folder with
    per_tensor=True). Returns the number of tensors written."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype '{dtype}' is not allowed; allowed: fp32, bf16, fp16")
    folder, manifest = _manifest(ckpt_dir, tag)
    files = [open(os.path.join(folder, f["name"]), "rb") for f in manifest["files"]]
    aliases = {}
    for alias, name in manifest.get("aliases", []):
        aliases.setdefault(name, []).append(alias)
    state, index = {}, {}
    if per_tensor:
        os.makedirs(out, exist_ok=True)
    try:
        for group in manifest["groups"]:
            for param in group["params"]:
                t = _assemble(folder, manifest, group, param, files).to(_DTYPES[dtype])
                names = [param["name"]] + aliases.get(param["name"], [])
                if per_tensor:
                    file = param["name"] + ".pt"
                    torch.save(t, os.path.join(out, file))
                    for n in names:
                        index[n] = file
                else:
                    for n in names:
                        state[n] = t
    finally:
        for f in files:
            f.close()
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
    p.add_argument("out", help="OUT.pt, or a folder with --per-tensor")
    p.add_argument("--tag", help="default: the one CKPT_DIR/latest names")
    p.add_argument("--dtype", default="fp32", choices=sorted(_DTYPES))
    p.add_argument("--per-tensor", action="store_true", help="one file per tensor")
    a = p.parse_args(argv)
    try:
        n = consolidate(a.ckpt_dir, a.out, a.tag, a.dtype, a.per_tensor)
    except (ValueError, OSError) as e:
        print(f"zeroshard-consolidate: {e}", file=sys.stderr)
        return 2
    print(f"zeroshard-consolidate: {n} tensors ({a.dtype}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
