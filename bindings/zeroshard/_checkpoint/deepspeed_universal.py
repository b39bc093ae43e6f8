"""zeroshard.convert_to_deepspeed_checkpoint(CKPT, OUT): a zeroshard checkpoint written as
DeepSpeed's universal checkpoint, which DeepSpeed's engine loads at any data-parallel size
and ZeRO stage with `"checkpoint": {"load_universal": true}` in its config: the way back
to DeepSpeed for a run trained here.

The layout DeepSpeed 0.19's loader reads (deepspeed/checkpoint/universal_checkpoint.py):
OUT/latest_universal names the tag; OUT/TAG/zero/NAME/fp32.pt holds each parameter's whole
fp32 master ({"param": tensor}), beside it one file per optimizer state array (exp_avg.pt,
exp_avg_sq.pt, ...) and step.pt; OUT/TAG/zero/optimizer_state.pt the optimizer's global
state, its step (where ZeRO 3's loader reads it; that loader takes Adam's exp_avg and
exp_avg_sq only) and param_groups, which DeepSpeed pairs with its own groups by position (one empty
entry per parameter here: every group of the loading run finds one, each parameter is
read by name, and the hyperparameters stay the loading config's); the model-states file
(mp_rank_00_model_states.pt, and zero_pp_rank_0_mp_rank_00_model_states.pt for ZeRO 3)
the step counts, the scheduler's position as DeepSpeed's schedulers keep it
(last_batch_iteration), the buffers and the client_state.

DeepSpeed's universal loader restores parameters and optimizer state, not buffers (its
model's own stay; the conversion warns naming them) and, at ZeRO 3, Adam's moments only.

Written: data-parallel runs (one pipeline stage, no tensor-parallel parts), with a Hugging
Face model's experts split by AutoEP as DeepSpeed's AutoEP names them (deepspeed_autoep.py
deepspeed_names: w1, w3, w2 of the whole layer, marked as expert parameters, which its
loader cuts for its own autoep_size). Refused by name: DeepSpeed's MoE layer's experts
split over ranks, tensor- or pipeline-parallel checkpoints, frozen parameters, fp16's
dynamic loss scale (DeepSpeed's scaler is an object of its own)."""
import os
import shutil
import warnings

import torch

from .. import _zeroshard
from . import consolidate as _consolidate
from . import deepspeed_autoep as _autoep

DEEPSPEED_VERSION = "0.19.8"  # the layout written is the one this DeepSpeed reads


def _error(message):
    return _zeroshard.Error(f"convert_to_deepspeed_checkpoint: {message}")


def _manifest(ckpt_dir, tag):
    stages = _consolidate._parts(ckpt_dir, tag)
    if len(stages) != 1 or len(stages[0]) != 1:
        raise _error(f"'{ckpt_dir}' was saved by {len(stages)} pipeline stages of "
                     f"{len(stages[0])} tensor-parallel parts; allowed: one stage, one part "
                     "(a data-parallel run)")
    folder, manifest = stages[0][0]
    for group in manifest["groups"]:
        if group.get("ranks") and not all(_fused_layer(p) for p in group["params"]):
            raise _error(f"'{folder}' holds DeepSpeed MoE layer experts split over "
                         "expert-parallel ranks; allowed: AutoEP's (a Hugging Face model's "
                         "fused experts), or expert parallelism 1")
    if manifest.get("loss_scale"):
        raise _error(f"'{folder}' keeps fp16's dynamic loss scale; allowed: bf16 or fp32 runs")
    return folder, manifest


def _fused_layer(param):
    """The module path of the AutoEP layer whose fused experts `param` is a part of, or None."""
    for end in (".experts.gate_up_proj", ".experts.down_proj"):
        if "whole_shape" in param and param["name"].endswith(end):
            return param["name"][:-len(end)]
    return None


def _model_states(manifest, buffers):
    steps = int(manifest.get("optimizer_steps", 0))
    state = {"module": dict(buffers), "buffer_names": list(buffers),
             "global_steps": int(manifest.get("global_steps", steps)),
             "skipped_steps": int(manifest.get("skipped_steps", 0)),
             "dp_world_size": int(manifest["world_size"]), "mp_world_size": 1,
             "lr_scheduler": {"last_batch_iteration": int(manifest.get("schedule_steps",
                                                                       steps)) - 1},
             "ds_version": DEEPSPEED_VERSION}
    client = manifest.get("client_state") or {}
    clashes = sorted(set(client) & set(state))
    if clashes:
        raise _error(f"client_state keys {clashes} are DeepSpeed's own; allowed: other names")
    state.update(client)
    return state


def _write(folder, manifest, out):
    files = [open(os.path.join(folder, f["name"]), "rb") for f in manifest["files"]]
    try:
        arrays = ["fp32"] + list(manifest.get("optimizer_state") or [])
        step = torch.tensor(float(manifest.get("optimizer_steps", 0)))
        layers = {_fused_layer(p) for g in manifest["groups"] for p in g["params"]} - {None}
        params, done = 0, set()
        for group in manifest["groups"]:
            if not group["trainable"]:
                raise _error(f"'{folder}' holds frozen parameters ({group['params'][0]['name']}, "
                             "...); allowed: every parameter trained")
            for param in group["params"]:
                if param["name"] in done:  # a part of fused experts: written whole at the first
                    continue
                done.add(param["name"])
                for k, array in enumerate(arrays):
                    whole = (_consolidate._joined(folder, manifest, param["name"], files, k)
                             if "whole_shape" in param else
                             _consolidate._assemble(folder, manifest, group, param, files, k))
                    # AutoEP's layers under DeepSpeed's names (deepspeed_autoep.py)
                    for name, entry in _autoep.deepspeed_names(param["name"], whole, layers):
                        where = os.path.join(out, "zero", name)
                        os.makedirs(where, exist_ok=True)
                        torch.save(entry, os.path.join(where, f"{array}.pt"))
                        if k == 0:
                            torch.save(step, os.path.join(where, "step.pt"))
                            params += 1
        buffers = {b["name"]: _consolidate._buffer(files, b) for b in manifest.get("buffers") or []}
    finally:
        for f in files:
            f.close()
    # ZeRO 3's loader reads the step from the inner optimizer's state (and, as ZeRO 1-2's,
    # nothing but the group options from param_groups).
    torch.save({"param_groups": [{} for _ in range(params)], "ds_version": DEEPSPEED_VERSION,
                "dynamic_loss_scale": False, "overflow": False,
                "optimizer_state_dict": {"state": {0: {"step": step}}, "param_groups": [{}]}},
               os.path.join(out, "zero", "optimizer_state.pt"))
    if buffers:  # said, since DeepSpeed will not
        warnings.warn(f"convert_to_deepspeed_checkpoint: {len(buffers)} buffers ("
                      f"{', '.join(list(buffers)[:3])}{', ...' if len(buffers) > 3 else ''}) are "
                      "written, but DeepSpeed's universal loader restores parameters and "
                      "optimizer state only: its run keeps the buffers its model builds")
    states = _model_states(manifest, buffers)
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        torch.save(states, os.path.join(out, name))


def convert_to_deepspeed_checkpoint(ckpt_dir, out_dir, tag=None):
    """Writes zeroshard's checkpoint CKPT_DIR (its latest tag, or TAG) as DeepSpeed's
    universal checkpoint in OUT_DIR under the same tag, and OUT_DIR/latest_universal;
    returns the tag. DeepSpeed loads it with `"checkpoint": {"load_universal": true}`."""
    folder, manifest = _manifest(ckpt_dir, tag)
    name = os.path.basename(folder)
    target = os.path.join(out_dir, name)
    # Written beside the target, then put in its place: a failed conversion leaves what
    # was there (an earlier conversion of the tag) as it was.
    tmp, old = (f"{target}.zeroshard-{what}-{os.getpid()}" for what in ("tmp", "old"))
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        _write(folder, manifest, tmp)
        if os.path.exists(target):
            os.replace(target, old)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    latest = os.path.join(out_dir, "latest_universal")
    with open(latest + ".tmp", "w") as f:
        f.write(name)
    os.replace(latest + ".tmp", latest)
    return name
