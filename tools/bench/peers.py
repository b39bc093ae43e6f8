#!/usr/bin/env python3
"""zs bench peers: zeroshard beside torch's own DDP and FSDP on the same model and data.

The GPT here is built exactly as tools/bench/BenchGpt.cpp builds it (same modules in
the same order, same seed, same data generator), so the final losses are comparable.
Every configuration runs on 2 local ranks over Gloo with one thread per rank; torch's
runs are plain processes (torchrun needs libuv, which Debian's torch 2.x lacks).
Run inside the LibTorch 2.x root: ./zs bench peers [--json].
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SHAPE = dict(vocab=2048, dim=256, layers=4, heads=4, seq=128)
TORCH_MODES = ["ddp", "fsdp_no_shard", "fsdp_shard_grad_op", "fsdp_full_shard"]


def build_model(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, 4 * dim)
            self.fc2 = nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, d = x.shape
            hd = d // self.heads
            q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
            split = lambda p: p.view(b, t, self.heads, hd).transpose(1, 2)
            scores = split(q) @ split(k).transpose(-2, -1) / hd**0.5
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, -1e4).softmax(-1)
            attended = (scores @ split(v)).transpose(1, 2).reshape(b, t, d)
            h = x + self.proj(attended)
            return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))

    class Gpt(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.s = s
            self.emb = nn.Embedding(s["vocab"], s["dim"])
            with torch.no_grad():
                self.emb.weight.normal_(0, 0.02)
            self.blocks = nn.ModuleList(Block(s["dim"], s["heads"]) for _ in range(s["layers"]))
            self.ln_f = nn.LayerNorm(s["dim"])

        def forward(self, tokens):
            inp, target = tokens[:, : self.s["seq"]], tokens[:, 1:]
            h = self.emb(inp)
            for block in self.blocks:
                h = block(h)
            logits = self.ln_f(h) @ self.emb.weight.t()  # tied head
            return F.cross_entropy(logits.reshape(-1, self.s["vocab"]), target.reshape(-1))

    return Gpt, Block


def wrap(torch, mode, model, block_type):
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = {
        "fsdp_no_shard": ShardingStrategy.NO_SHARD,
        "fsdp_shard_grad_op": ShardingStrategy.SHARD_GRAD_OP,
        "fsdp_full_shard": ShardingStrategy.FULL_SHARD,
    }[mode]
    return FSDP(model, sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({block_type}),
                device_id=torch.device("cpu"))


def worker(mode, out, steps, warmup, batch):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    Gpt, Block = build_model(torch)
    torch.manual_seed(0)
    model = wrap(torch, mode, Gpt(SHAPE), Block)
    # zeroshard's defaults, as the C++ bench uses them: AdamW lr 1e-3, weight decay 0.01
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    phases = {"forward": [], "backward": [], "step": []}
    totals, loss = [], None
    for i in range(warmup + steps):
        tokens = torch.randint(SHAPE["vocab"], (batch, SHAPE["seq"] + 1), generator=gen)
        t0 = time.perf_counter()
        loss = model(tokens)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if mode == "ddp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        else:
            model.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        if i >= warmup:
            phases["forward"].append(t1 - t0)
            phases["backward"].append(t2 - t1)
            phases["step"].append(t3 - t2)
            totals.append(t3 - t0)
    if rank == 0:
        median = statistics.median(totals)
        with open(out, "w") as f:
            json.dump({
                "system": mode,
                "median_step_seconds": median,
                "tokens_per_second": batch * SHAPE["seq"] * dist.get_world_size() / median,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "final_loss": loss.item(),
                "phase_seconds": {k: statistics.median(v) for k, v in phases.items()},
            }, f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(mode, args, ranks=2):
    out = tempfile.mktemp(suffix=".json")
    port = free_port()
    procs = []
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0",
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, __file__, "--worker", mode, out, "--steps", str(args.steps),
               "--batch", str(args.batch)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit(f"{mode} failed:\n" + "\n".join(logs))
    with open(out) as f:
        row = json.load(f)
    os.remove(out)
    return row


def run_zeroshard(args):
    cmd = [args.zs_bench, "--json", "--stages", "0,2,3", "--steps", str(args.steps),
           "--batch", str(args.batch)]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    for r in rows:
        r["system"] = f"zeroshard_stage{r['stage']}"
    return rows


def compare(rows):
    by = {r["system"]: r for r in rows}

    def ratio(a, b, key):
        return by[a][key] / by[b][key]

    result = {
        "zs3_vs_fsdp_full_shard_throughput": ratio("zeroshard_stage3", "fsdp_full_shard",
                                                   "tokens_per_second"),
        "zs3_vs_fsdp_full_shard_peak_rss": ratio("zeroshard_stage3", "fsdp_full_shard",
                                                 "peak_rss_bytes"),
        "zs2_vs_fsdp_shard_grad_op_throughput": ratio("zeroshard_stage2", "fsdp_shard_grad_op",
                                                      "tokens_per_second"),
        "zs0_vs_ddp_throughput": ratio("zeroshard_stage0", "ddp", "tokens_per_second"),
    }
    targets = [("zs3_vs_fsdp_full_shard_throughput", 1.0, "zeroshard_stage3", "fsdp_full_shard"),
               ("zs2_vs_fsdp_shard_grad_op_throughput", 1.0, "zeroshard_stage2",
                "fsdp_shard_grad_op"),
               ("zs0_vs_ddp_throughput", 0.95, "zeroshard_stage0", "ddp")]
    shortfalls = []
    for key, target, ours, peer in targets:
        if result[key] >= target:
            continue
        diffs = {p: by[ours]["phase_seconds"][p] - by[peer]["phase_seconds"][p]
                 for p in ("forward", "backward", "step")}
        worst = max(diffs, key=diffs.get)
        shortfalls.append(f"{ours} is {result[key]:.2f}x {peer} (target {target}); the "
                          f"{worst} phase costs {diffs[worst] * 1e3:.1f} ms more per step")
    result["shortfalls"] = shortfalls
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "OUT"))
    parser.add_argument("--zs-bench", default="build-trixie/tools/zs-bench-sharding")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args.worker[1], args.steps, 2, args.batch)
    rows = [run_torch(mode, args) for mode in TORCH_MODES] + run_zeroshard(args)
    summary = compare(rows)
    if args.json:
        print(json.dumps({"systems": rows, **summary}, indent=2))
        return
    print(f"GPT {SHAPE['layers']} layers x {SHAPE['dim']}, 2 ranks over Gloo, fp32, "
          f"{args.steps} timed steps, batch {args.batch} x {SHAPE['seq']} tokens per rank")
    print(f"{'system':<22}{'median ms':>10}{'tokens/s':>10}{'peak RSS MB':>13}{'final loss':>12}"
          f"{'fwd ms':>8}{'bwd ms':>8}{'step ms':>8}")
    for r in rows:
        p = r["phase_seconds"]
        print(f"{r['system']:<22}{r['median_step_seconds'] * 1e3:>10.1f}"
              f"{r['tokens_per_second']:>10.0f}{r['peak_rss_bytes'] / 1e6:>13.1f}"
              f"{r['final_loss']:>12.4f}{p['forward'] * 1e3:>8.1f}{p['backward'] * 1e3:>8.1f}"
              f"{p['step'] * 1e3:>8.1f}")
    for key, value in summary.items():
        if key != "shortfalls":
            print(f"{key}: {value:.3f}")
    for line in summary["shortfalls"]:
        print("short:", line)


if __name__ == "__main__":
    main()
