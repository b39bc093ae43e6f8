#!/usr/bin/env python3
"""zs bench peers: zeroshard beside torch's DDP, FSDP1 and FSDP2 and DeepSpeed's ZeRO, on
the same model, data and seed, in one run.

Every configuration runs on 2 local ranks over Gloo with one thread per rank, on the
main leg's torch (the venv's); the peers run tools/bench/peer_worker.py, zeroshard
runs zs-bench-sharding. A peer that crashes, or ends at another loss than DDP, keeps
its row with what it printed: that is a result too. Run: ./zs bench peers [--json].
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/: deepspeed_ops
import deepspeed_ops  # noqa: E402
from peer_worker import MODES, SHAPE  # noqa: E402

RANKS = 2
LOSS_TOLERANCE = 1e-3  # relative, final loss against DDP's (fp32 throughout)
# zeroshard's rows: (name, extra zs-bench-sharding arguments)
ZS_RUNS = [
    ("zeroshard_stage{stage}", ["--stages", "0,2,3"]),
    ("zeroshard_stage3_offload_cpu", ["--stages", "3", "--offload-optimizer", "cpu"]),
    ("zeroshard_stage3_offload_nvme",
     ["--stages", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme"]),
]
# (key, ours, peer, what is compared)
RATIOS = [
    ("zs3_vs_fsdp_full_shard_throughput", "zeroshard_stage3", "fsdp_full_shard", "tokens_per_second"),
    ("zs3_vs_fsdp_full_shard_peak_rss", "zeroshard_stage3", "fsdp_full_shard", "peak_rss_bytes"),
    ("zs2_vs_fsdp_shard_grad_op_throughput", "zeroshard_stage2", "fsdp_shard_grad_op",
     "tokens_per_second"),
    ("zs0_vs_ddp_throughput", "zeroshard_stage0", "ddp", "tokens_per_second"),
    ("zs3_vs_deepspeed_z3_throughput", "zeroshard_stage3", "deepspeed_z3", "tokens_per_second"),
    ("zs3_vs_deepspeed_z3_peak_rss", "zeroshard_stage3", "deepspeed_z3", "peak_rss_bytes"),
    ("zs3_vs_fsdp2_throughput", "zeroshard_stage3", "fsdp2", "tokens_per_second"),
    ("zs3_vs_fsdp2_peak_rss", "zeroshard_stage3", "fsdp2", "peak_rss_bytes"),
    ("zs3_offload_vs_deepspeed_offload_throughput", "zeroshard_stage3_offload_cpu",
     "deepspeed_z3_offload_cpu", "tokens_per_second"),
]
# (what, the check, the target as a reader sees it)
TARGETS = [
    ("zeroshard stage 3 vs FSDP2 tokens/s", lambda r: r["zs3_vs_fsdp2_throughput"] >= 1.15, ">= 1.15"),
    ("zeroshard stage 3 vs DeepSpeed ZeRO-3 tokens/s",
     lambda r: r["zs3_vs_deepspeed_z3_throughput"] >= 1.2, ">= 1.2"),
    ("zeroshard stage 3 peak RSS vs the smaller of FSDP2's and DeepSpeed ZeRO-3's",
     lambda r: max(r["zs3_vs_fsdp2_peak_rss"], r["zs3_vs_deepspeed_z3_peak_rss"]) <= 0.8, "<= 0.8"),
    ("zeroshard stage 3 + CPU optimizer vs DeepSpeed ZeRO-3 + CPU offload tokens/s",
     lambda r: r["zs3_offload_vs_deepspeed_offload_throughput"] >= 1.2, ">= 1.2"),
    ("zeroshard stage 0 vs DDP tokens/s", lambda r: r["zs0_vs_ddp_throughput"] >= 0.95, ">= 0.95"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failed_row(system, what):
    return {"system": system, "error": what[-2000:]}


def run_peer(mode, args, scratch):
    out = os.path.join(scratch, mode)
    nvme = os.path.join(scratch, f"{mode}-nvme")
    os.makedirs(nvme, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(RANKS):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS),
                   LOCAL_WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.join(HERE, "peer_worker.py"), mode, out, str(args.steps),
               str(args.batch), nvme]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=1200)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return failed_row(mode, "did not finish in 1200 s")
    if any(p.returncode != 0 for p in procs):
        bad = next(r for r, p in enumerate(procs) if p.returncode != 0)
        return failed_row(mode, f"rank {bad} exited {procs[bad].returncode}:\n{logs[bad]}")
    return merge_ranks([json.load(open(f"{out}.rank{r}.json")) for r in range(RANKS)])


def merge_ranks(rows):
    """Rank 0's times and loss; the largest peak RSS of any rank."""
    row = dict(rows[0])
    row["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rows)
    return row


def run_zeroshard(args, scratch):
    rows = []
    for name, extra in ZS_RUNS:
        cmd = [args.zs_bench, "--json", "--ranks", str(RANKS), "--steps", str(args.steps),
               "--batch", str(args.batch), "--nvme-path", scratch] + extra
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            rows.append(failed_row(name.format(stage=3), run.stdout + run.stderr))
            continue
        for r in json.loads(run.stdout):
            r["system"] = name.format(stage=r["stage"])
            rows.append(r)
    return rows


def compare(rows):
    by = {r["system"]: r for r in rows if "error" not in r}
    ratios = {}
    for key, ours, peer, what in RATIOS:
        ok = ours in by and peer in by
        ratios[key] = by[ours][what] / by[peer][what] if ok else None
    reference = by.get("ddp", {}).get("final_loss")
    for r in rows:
        if "error" not in r and reference is not None:
            r["loss_differs_from_ddp"] = abs(r["final_loss"] - reference) > LOSS_TOLERANCE * abs(reference)
    results = []
    for what, check, target in TARGETS:
        try:
            results.append({"target": f"{what} {target}", "met": bool(check(ratios))})
        except TypeError:  # a row it needs failed
            results.append({"target": f"{what} {target}", "met": None})
    return ratios, results


def print_table(rows, ratios, targets, args):
    print(f"GPT {SHAPE['layers']} layers x {SHAPE['dim']}, {RANKS} ranks over Gloo, fp32, "
          f"{args.steps} timed steps, batch {args.batch} x {SHAPE['seq']} tokens per rank")
    print(f"{'system':<32}{'median ms':>10}{'tokens/s':>10}{'peak RSS MB':>13}{'final loss':>12}"
          f"{'fwd ms':>8}{'bwd ms':>8}{'step ms':>8}")
    for r in rows:
        if "error" in r:
            last = [line for line in r["error"].splitlines() if line.strip()][-1:] or ["?"]
            print(f"{r['system']:<32}FAILED: {last[0][:150]}")
            continue
        p = r["phase_seconds"]
        flag = "  (loss differs from DDP)" if r.get("loss_differs_from_ddp") else ""
        print(f"{r['system']:<32}{r['median_step_seconds'] * 1e3:>10.1f}"
              f"{r['tokens_per_second']:>10.0f}{r['peak_rss_bytes'] / 1e6:>13.1f}"
              f"{r['final_loss']:>12.4f}{p['forward'] * 1e3:>8.1f}{p['backward'] * 1e3:>8.1f}"
              f"{p['step'] * 1e3:>8.1f}{flag}")
    for key, value in ratios.items():
        print(f"{key}: {'n/a (a row it needs failed or was not run)' if value is None else f'{value:.3f}'}")
    for t in targets:
        state = {True: "met", False: "NOT met", None: "not measured (a row it needs failed or was not run)"}[t["met"]]
        print(f"target {t['target']}: {state}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zs-bench", default="build/tools/zs-bench-sharding")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--only", help="comma-separated peer modes to run (default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = args.only.split(",") if args.only else MODES
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"--only: unknown mode(s) {', '.join(unknown)}; allowed: {', '.join(MODES)}")
    if any(m.startswith("deepspeed") and "offload" in m for m in modes):
        print(deepspeed_ops.prepare(cpu=True)[0], file=sys.stderr)  # not inside a row's time
    with tempfile.TemporaryDirectory(prefix="zs-bench-peers-") as scratch:
        rows = [run_peer(mode, args, scratch) for mode in modes] + run_zeroshard(args, scratch)
    ratios, targets = compare(rows)
    if args.json:
        print(json.dumps({"systems": rows, **ratios, "targets": targets}, indent=2))
    else:
        print_table(rows, ratios, targets, args)


if __name__ == "__main__":
    main()
