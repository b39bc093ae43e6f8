#!/usr/bin/env python3
"""zs bench hosts: 2 hosts x 2 ranks behind a limited link, the GPT of `zs bench
sharding`/`peers`, in one run: zeroshard stage 3 sharded across all 4 ranks, stage 3
sharded inside each host (mics_shard_size 2, DeepSpeed's MiCS), stage 3 with a secondary
copy per host (zero_hpz_partition_size 2, ZeRO++ hpZ), and torch FSDP2, flat and as HSDP (a 2-D mesh: replicated across hosts, sharded inside each).

Hosts are network namespaces on a bridge (tools/bench/netns.py), each host's link
limited by tbf to --rate both ways; every rank runs tools/bench/peer_worker.py inside its
host's namespace. Per system: median step, tokens/s, peak RSS per rank, final loss, and
the bytes that crossed between the hosts per timed step (each host's eth0 counter, read
by its first rank around the timed steps, summed over hosts).
Needs root (namespaces); says why and exits 2 where they cannot be made.
Run: ./zs bench hosts [--json] [--rate 1gbit] [--steps 8]."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns  # noqa: E402
from peer_worker import HOST_MODES, SHAPE  # noqa: E402
from peers import failed_row, free_port  # noqa: E402

HOSTS, PER_HOST = 2, 2
WORLD = HOSTS * PER_HOST
HIERARCHICAL = ["zeroshard_stage3_mics", "zeroshard_stage3_hpz"]
# (what, the check, the target as a reader sees it)
TARGETS = [
    ("hierarchical vs stage 3 bytes between hosts per step",
     lambda r: r["hierarchical_vs_stage3_interhost_bytes"] <= 0.55, "<= 0.55"),
    ("hierarchical vs stage 3 speed", lambda r: r["hierarchical_vs_stage3_speedup"] >= 1.3,
     ">= 1.3"),
    ("hierarchical vs FSDP2 HSDP speed", lambda r: r["hierarchical_vs_fsdp2_hsdp_speedup"] >= 1.0,
     ">= 1.0"),
    ("hierarchical vs FSDP2 HSDP peak RSS",
     lambda r: r["hierarchical_vs_fsdp2_hsdp_peak_rss"] <= 1.0, "<= 1.0"),
]


def run_system(mode, args, scratch, package):
    out = os.path.join(scratch, mode)
    port = free_port()
    with netns.hosts(HOSTS, args.rate) as h:
        launch = h.launch(PER_HOST)
        procs = []
        for rank in range(WORLD):
            prefix, env = launch(rank)
            # torch's Gloo binds the address the host name resolves to (127.0.0.1 here),
            # where peers on other hosts never connect: every system is told the
            # interface, as torch's users are told to (zeroshard would find it alone).
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1", PYTHONPATH=package, GLOO_SOCKET_IFNAME="eth0", **env)
            cmd = prefix + [sys.executable, os.path.join(HERE, "peer_worker.py"), mode, out,
                            str(args.steps), str(args.batch), scratch]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=600)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                return failed_row(mode, "did not finish in 600 s")
    if any(p.returncode != 0 for p in procs):
        bad = next(r for r, p in enumerate(procs) if p.returncode != 0)
        return failed_row(mode, f"rank {bad} exited {procs[bad].returncode}:\n{logs[bad]}")
    ranks = [json.load(open(f"{out}.rank{r}.json")) for r in range(WORLD)]
    row = dict(ranks[0])
    row["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in ranks)
    row["interhost_bytes_per_step"] = sum(r["link_sent_bytes_per_step"] or 0 for r in ranks)
    return row


def ratio(by, ours, peer, what, invert=False):
    if ours not in by or peer not in by:
        return None
    a, b = by[ours][what], by[peer][what]
    return b / a if invert else a / b


def compare(rows):
    by = {r["system"]: r for r in rows if "error" not in r}
    best = min((m for m in HIERARCHICAL if m in by),
               key=lambda m: by[m]["median_step_seconds"], default=None)
    ratios = {
        "hierarchical_mode": best,
        "hierarchical_vs_stage3_interhost_bytes":
            ratio(by, best, "zeroshard_stage3", "interhost_bytes_per_step"),
        "hierarchical_vs_stage3_speedup":
            ratio(by, best, "zeroshard_stage3", "median_step_seconds", invert=True),
        "hierarchical_vs_fsdp2_hsdp_speedup":
            ratio(by, best, "fsdp2_hsdp", "median_step_seconds", invert=True),
        "hierarchical_vs_fsdp2_hsdp_peak_rss": ratio(by, best, "fsdp2_hsdp", "peak_rss_bytes"),
        "stage3_vs_fsdp2_speedup":
            ratio(by, "zeroshard_stage3", "fsdp2", "median_step_seconds", invert=True),
    }
    for mode in HIERARCHICAL:  # each mode's own figures, whichever is the better
        short = mode.rsplit("_", 1)[1]
        ratios[f"{short}_vs_stage3_interhost_bytes"] = ratio(
            by, mode, "zeroshard_stage3", "interhost_bytes_per_step")
        ratios[f"{short}_vs_stage3_speedup"] = ratio(
            by, mode, "zeroshard_stage3", "median_step_seconds", invert=True)
    targets = []
    for what, check, target in TARGETS:
        try:
            targets.append({"target": f"{what} {target}", "met": bool(check(ratios))})
        except TypeError:  # a row it needs failed
            targets.append({"target": f"{what} {target}", "met": None})
    return ratios, targets


def print_table(rows, ratios, targets, args):
    print(f"GPT {SHAPE['layers']} layers x {SHAPE['dim']}, {HOSTS} hosts x {PER_HOST} ranks over "
          f"Gloo, link {args.rate} each way (tbf), fp32, {args.steps} timed steps, batch "
          f"{args.batch} x {SHAPE['seq']} tokens per rank")
    print(f"{'system':<26}{'median ms':>10}{'tokens/s':>10}{'MB between hosts/step':>23}"
          f"{'peak RSS MB':>13}{'final loss':>12}")
    for r in rows:
        if "error" in r:
            last = [line for line in r["error"].splitlines() if line.strip()][-1:] or ["?"]
            print(f"{r['system']:<26}FAILED: {last[0][:150]}")
            continue
        print(f"{r['system']:<26}{r['median_step_seconds'] * 1e3:>10.1f}"
              f"{r['tokens_per_second']:>10.0f}{r['interhost_bytes_per_step'] / 1e6:>23.2f}"
              f"{r['peak_rss_bytes'] / 1e6:>13.1f}{r['final_loss']:>12.4f}")
    for key, value in ratios.items():
        shown = value if isinstance(value, str) or value is None else f"{value:.3f}"
        print(f"{key}: {'n/a (a row it needs failed)' if value is None else shown}")
    for t in targets:
        state = {True: "met", False: "NOT met", None: "not measured (a row it needs failed)"}
        print(f"target {t['target']}: {state[t['met']]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", default="build/python",
                        help="the folder holding the built zeroshard package")
    parser.add_argument("--rate", default="1gbit", help="each host's link, as tc writes it")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--only", help="comma-separated systems to run (default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = args.only.split(",") if args.only else HOST_MODES
    unknown = [m for m in modes if m not in HOST_MODES]
    if unknown:
        sys.exit(f"--only: unknown system(s) {', '.join(unknown)}; allowed: {', '.join(HOST_MODES)}")
    why = netns.unavailable()
    if why:
        print(f"zs bench hosts: cannot make hosts here: {why}", file=sys.stderr)
        sys.exit(2)
    package = os.path.abspath(args.package)
    with tempfile.TemporaryDirectory(prefix="zs-bench-hosts-") as scratch:
        rows = [run_system(mode, args, scratch, package) for mode in modes]
    ratios, targets = compare(rows)
    if args.json:
        print(json.dumps({"systems": rows, **ratios, "targets": targets}, indent=2))
    else:
        print_table(rows, ratios, targets, args)


if __name__ == "__main__":
    main()
