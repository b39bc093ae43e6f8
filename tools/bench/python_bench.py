"""zs bench python: the same GPT-style model on 2 local ranks under torch DDP (gloo) +
AdamW and under zeroshard stage 0 and stage 3, in one run: tokens/s, peak RSS per rank,
and model-state bytes per rank (DDP: parameters, gradients, AdamW state and DDP's
gradient buckets, from the tensors themselves; zeroshard: its MemoryLedger).
usage: python_bench.py [--json] [--steps N]"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

import torch
import torch.nn as nn

from bench_gpt import gpt_classes

VOCAB, DIM, LAYERS, HEADS, SEQ, ROWS = 2048, 256, 6, 4, 128, 8
STATE_KINDS = ("params", "master_params", "grads", "grads_fp32", "optimizer_states")


Gpt, _ = gpt_classes(torch)  # the C++ benchmarks' GPT (bench_gpt.py)
SHAPE = {"vocab": VOCAB, "dim": DIM, "layers": LAYERS, "heads": HEADS, "seq": SEQ}


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def rank_main(mode, steps, out):
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = Gpt(SHAPE)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(VOCAB, (ROWS, SEQ + 1), generator=gen) for _ in range(4)]
    if mode == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def train_step(tokens):
            opt.zero_grad(set_to_none=False)
            ddp(tokens).backward()
            opt.step()

        def state_bytes():
            params = list(model.parameters())
            grads = [p.grad for p in params]
            adam = [t for s in opt.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor) and t.dim() > 0]
            # DDP's reducer copies gradients into buckets of the same total size
            # (gradient_as_bucket_view=False, the default).
            return tensor_bytes(params) + 2 * tensor_bytes(grads) + tensor_bytes(adam)
    else:
        import zeroshard
        stage = int(mode[-1])
        units = [model.emb, *model.blocks]
        engine, *_ = zeroshard.initialize(
            model=model, units=units,
            config={"zero_optimization": {"stage": stage, "reduce_bucket_size": 2_000_000},
                    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})

        def train_step(tokens):
            engine.backward(engine(tokens))
            engine.step()

        def state_bytes():
            kinds = engine.memory_report()["device"]["kinds"]
            return sum(kinds[k]["current"] for k in STATE_KINDS)
    for i in range(3):  # warm-up
        train_step(batches[i % 4])
    t0 = time.perf_counter()
    for i in range(steps):
        train_step(batches[i % 4])
    seconds = time.perf_counter() - t0
    result = {"tokens_per_s": steps * ROWS * SEQ * world / seconds, "state_bytes": state_bytes(),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)


def launch(mode, steps, world=2):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = f"/tmp/zs-bench-python-{os.getpid()}-{mode}"
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   ZS_NUM_THREADS="1", OMP_NUM_THREADS="1", USE_LIBUV="0")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-mode", mode,
                                       "--steps", str(steps), "--out", out], env=env))
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"python_bench: {mode} rank failed")
    results = []
    for r in range(world):
        with open(f"{out}.rank{r}.json") as f:
            results.append(json.load(f))
        os.remove(f"{out}.rank{r}.json")
    return {"tokens_per_s": results[0]["tokens_per_s"],
            "state_bytes": max(x["state_bytes"] for x in results),
            "peak_rss_bytes": max(x["peak_rss_bytes"] for x in results)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rank-mode")
    p.add_argument("--out")
    a = p.parse_args()
    if a.rank_mode:
        rank_main(a.rank_mode, a.steps, a.out)
        return
    runs = {}
    for mode in ("ddp", "zs0", "zs3", "ddp", "zs0", "zs3"):  # interleaved, best of two
        r = launch(mode, a.steps)
        best = runs.get(mode)
        if best is None or r["tokens_per_s"] > best["tokens_per_s"]:
            runs[mode] = r
    ddp = runs["ddp"]
    summary = {"stage0_vs_ddp_throughput": runs["zs0"]["tokens_per_s"] / ddp["tokens_per_s"],
               "stage3_vs_ddp_throughput": runs["zs3"]["tokens_per_s"] / ddp["tokens_per_s"],
               "stage3_state_fraction_vs_ddp": runs["zs3"]["state_bytes"] / ddp["state_bytes"],
               "stage0_state_fraction_vs_ddp": runs["zs0"]["state_bytes"] / ddp["state_bytes"],
               "stage3_rss_fraction_vs_ddp": runs["zs3"]["peak_rss_bytes"] / ddp["peak_rss_bytes"],
               "runs": runs}
    if a.json:
        print(json.dumps(summary, indent=2))
        return
    n = sum(p.numel() for p in Gpt(SHAPE).parameters())
    print(f"GPT {n / 1e6:.2f}M parameters ({LAYERS} x d {DIM}), 2 ranks x 1 thread, "
          f"{ROWS} x {SEQ} tokens per rank per step, fp32, best of 2 interleaved runs")
    print(f"{'':22s}{'tokens/s':>10s}{'vs DDP':>8s}{'states MiB/rank':>17s}{'vs DDP':>8s}"
          f"{'peak RSS MiB':>14s}")
    for mode, label in (("ddp", "torch DDP + AdamW"), ("zs0", "zeroshard stage 0"),
                        ("zs3", "zeroshard stage 3")):
        r = runs[mode]
        print(f"{label:22s}{r['tokens_per_s']:10.0f}{r['tokens_per_s'] / ddp['tokens_per_s']:8.2f}"
              f"{r['state_bytes'] / 2**20:17.1f}{r['state_bytes'] / ddp['state_bytes']:8.2f}"
              f"{r['peak_rss_bytes'] / 2**20:14.0f}")


if __name__ == "__main__":
    main()
