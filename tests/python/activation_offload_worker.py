"""One rank of test_activation_offload.py: a transformers Llama of LAYERS blocks trained for
three steps under each activation_checkpointing policy of OFFLOADS at ZeRO stages 2 and 3
(bf16), with the losses and gradient norms; the ledger's activations on the host and NVMe
tiers after a forward (what waits for backward) and at their peak beside memory_report's
prediction, at two sequence lengths; the host buffers the store has made after each step
and what its pool holds at the end; at stage 2 also the bytes a forward allocates
and leaves alive on the device (torch's profiler); the swap file's size after three steps;
the swap directories left once the engines are gone; a GPT-2 at stage 3 under
GPT_RUNS, its losses and gradient norms, torch's checkpoint calls and the host's peak
activations.

usage: activation_offload_worker.py OUT"""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import transformers

import zeroshard
import devices
from test_activation_memory import BATCH, SEQ
from test_activation_offload import GPT_RUNS, OFFLOADS
from test_activation_policy import layered
from zeroshard._activations import policy as recompute_policy

zeroshard.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
out = sys.argv[1]
nvme = f"{out}.nvme{rank}"
config = layered("llama")
dev = devices.device()
ids = torch.randint(config.vocab_size, (3, BATCH, SEQ),
                    generator=torch.Generator().manual_seed(rank)).to(dev)


def engine_for(stage, keys, family=config):
    keys = dict(keys)
    if keys.get("offload", {}).get("device") == "nvme":
        keys["offload"] = dict(keys["offload"], nvme_path=nvme)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(family).to(dev, torch.bfloat16)
    return zeroshard.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": BATCH, "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage}, "activation_checkpointing": keys,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})[0]


def tiers(report, what):
    return {tier: report[tier]["kinds"]["activations"][what] for tier in ("device", "host", "nvme")}


def forward_kept(engine, batch):
    """Bytes the forward allocates on the device (on the CPU: torch's CPU allocator) and leaves
    alive; the host blocks of the store are allocated beside torch's allocator, out of this
    count."""
    gc.collect()
    if dev.type == "cuda":  # the caching allocator's live bytes
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(dev)
        loss = engine(input_ids=batch, labels=batch).loss
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated(dev) - before
        engine.backward(loss)
        engine.step()
        return kept
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        loss = engine(input_ids=batch, labels=batch).loss
    kept = sum(e.self_cpu_memory_usage for e in prof.key_averages())
    engine.backward(loss)
    engine.step()
    return kept


result = {}
for stage in (2, 3):
    for name, keys in OFFLOADS.items():
        engine = engine_for(stage, keys)
        run = {"losses": [], "norms": [], "held": {}, "made": []}
        for step in range(3):
            # The first step at half the length: memory_report plans for the largest batch
            # seen so far, so each length's prediction is read at its first step.
            seq = SEQ // 2 if step == 0 else SEQ
            batch = ids[step][:, :seq]
            loss = engine(input_ids=batch, labels=batch).loss
            if step < 2:
                run["held"][seq] = tiers(engine.memory_report(), "current")
                run[f"predicted {seq}"] = tiers(engine.memory_report(), "predicted")
            engine.backward(loss)
            engine.step()
            run["losses"].append(loss.item())
            run["norms"].append(engine.get_global_grad_norm())
            if "offload" in keys:
                run["made"].append(engine._engine.activation_store().buffers_made)
        report = engine.memory_report()
        run["peak"] = tiers(report, "peak")
        run["after"] = tiers(report, "current")
        if "offload" in keys:
            run["pooled"] = engine._engine.activation_store().pooled_bytes
        if keys.get("offload", {}).get("device") == "nvme":
            run["file_bytes"] = engine._engine.activation_store().file_bytes
        if stage == 2:  # every rank: a forward is collective
            run["forward_kept"] = forward_kept(engine, ids[0])
        result[f"{name} stage {stage}"] = run
        del engine, loss
# A GPT (GPT-2's blocks: fused qkv, learned positions, GELU MLP) at stage 3 under
# GPT_RUNS, three steps at SEQ.
gpt = layered("gpt2")
checkpoint, checkpoints = recompute_policy.torch_checkpoint.checkpoint, [0]


def counted(*args, **kwargs):
    checkpoints[0] += 1
    return checkpoint(*args, **kwargs)


recompute_policy.torch_checkpoint.checkpoint = counted
for name, keys in GPT_RUNS.items():
    engine = engine_for(3, keys, gpt)
    run = {"losses": [], "norms": []}
    checkpoints[0] = 0
    for step in range(3):
        loss = engine(input_ids=ids[step], labels=ids[step]).loss
        engine.backward(loss)
        engine.step()
        run["losses"].append(loss.item())
        run["norms"].append(engine.get_global_grad_norm())
    run["checkpoints"] = checkpoints[0]
    run["host peak"] = tiers(engine.memory_report(), "peak")["host"]
    result[f"gpt2 {name} stage 3"] = run
    del engine, loss
gc.collect()
result["swap dirs left"] = sorted(os.listdir(nvme)) if os.path.isdir(nvme) else []
with open(f"{out}.rank{rank}.json", "w") as f:
    json.dump(result, f)
