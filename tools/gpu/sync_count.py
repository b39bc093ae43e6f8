#!/usr/bin/env python3
"""How often a training step makes the host wait for the GPU: torch's sync debug mode
("warn") reports every synchronising CUDA call torch makes (an .item(), a copy to
pageable host memory, a stream or device synchronize), from Python and from the engine's
C++ alike; this counts them per step, past the first two steps, for zeroshard at stage 3
with the optimizer on the device, on the host, and on the host overlapped with backward.
The model is tests/python's tiny GPT, so the count is the engine's, not the model's.

usage: sync_count.py [--device cuda|cpu] [--steps N] [--json FILE]
On the CPU every count is 0 (nothing to wait for): that run checks the script."""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {"device_optimizer": "none", "host_optimizer": "cpu:false",
         "host_optimizer_overlapped": "cpu:true"}
MARK = "@@zs-step "
SYNC = re.compile(r"synchroniz", re.IGNORECASE)
WARMUP = 2
STAMP = re.compile(r"^\[[A-Z]\d{4} [\d:.]+ ")  # c10's "[W1126 08:21:38.216649715 "


def worker(device, offload, steps):
    import warnings

    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
    import models
    import zeroshard
    warnings.simplefilter("always")  # every synchronising call, not the first per line
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if offload != "none":
        where, overlap = offload.split(":")
        zero["offload_optimizer"] = {"device": where, "overlap_step": overlap == "true"}
    config = {"train_micro_batch_size_per_gpu": models.GLOBAL_ROWS,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": zero}
    model = models.make("gpt").to(device)
    engine, _, _, _ = zeroshard.initialize(model=model, config=config)
    batches = [models.batch(s, 0, 1).to(device) for s in range(steps)]
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
    losses = []
    for step in range(steps):
        print(f"{MARK}{step}", file=sys.stderr, flush=True)
        loss = engine(batches[step])
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())
    if device == "cuda":
        torch.cuda.set_sync_debug_mode(0)
    print(f"{MARK}end", file=sys.stderr, flush=True)
    print(json.dumps([float(x) for x in losses]))


def count(device, offload, steps):
    env = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29400 + os.getpid() % 500))
    p = subprocess.run([sys.executable, __file__, "--worker", device, offload, str(steps)],
                       capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    per_step, step, where = {}, None, {}
    for line in p.stderr.splitlines():
        if line.startswith(MARK):
            step = line[len(MARK):]
            per_step.setdefault(step, 0)
        elif step not in (None, "end") and SYNC.search(line):
            per_step[step] += 1
            if int(step) >= WARMUP:  # what called it, without the log line's time stamp
                said = STAMP.sub("", line.strip())[:160]
                where[said] = where.get(said, 0) + 1
    counted = [per_step[str(s)] for s in range(WARMUP, steps)]
    return {"per_step": [per_step.get(str(s), 0) for s in range(steps)],
            "mean_after_warmup": sum(counted) / max(1, len(counted)),
            "where": sorted(where.items(), key=lambda kv: -kv[1])[:12],
            "losses": json.loads(p.stdout.strip().splitlines()[-1])}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    import torch
    p.add_argument("--device", choices=["cuda", "cpu"],
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json")
    args = p.parse_args()
    result = {name: count(args.device, offload, args.steps) for name, offload in CASES.items()}
    for name, r in result.items():
        print(f"{name:28s} " + (f"syncs/step {r['mean_after_warmup']:.1f} (per step "
                                f"{r['per_step']})" if "error" not in r else "error: " +
                                r["error"][-300:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
