"""The `zeroshard` command (and `python -m zeroshard`): DeepSpeed's launcher's flags,
so that `deepspeed --num_gpus 2 train.py ARGS` becomes `zeroshard --num_gpus 2 train.py
ARGS`. It starts this node's ranks as plain processes with the environment torchrun
gives (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and, as
DeepSpeed's launcher does, `--local_rank=N` before the script's arguments. Each line a
rank prints is shown with its rank; when a rank fails the others are stopped and the
command exits with that rank's status.

Design notes.
- One node, or several with `--no_ssh`: every node runs the command with its own
  `--node_rank` and the same `--num_nodes` and `--master_addr` (DeepSpeed's no-ssh mode).
  Reaching other hosts over ssh/pdsh (a hostfile without --no_ssh) is refused: srun,
  mpirun or this command on each host start them instead.
- The rendezvous port: --master_port if given, else MASTER_PORT if set, else a free one
  on this host (a fixed default makes two jobs on one machine collide).
"""
import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading


def _error(message):
    print(f"zeroshard: {message}", file=sys.stderr)
    sys.exit(2)


def parse(argv):
    p = argparse.ArgumentParser(
        prog="zeroshard", description="Start a training script's ranks (DeepSpeed's launcher flags).")
    p.add_argument("-H", "--hostfile", default=None)
    p.add_argument("-i", "--include", default="")
    p.add_argument("-e", "--exclude", default="")
    p.add_argument("--num_nodes", type=int, default=-1)
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("--master_port", type=int, default=None)
    p.add_argument("--master_addr", default="")
    p.add_argument("--node_rank", type=int, default=-1)
    p.add_argument("--no_ssh", action="store_true")
    p.add_argument("--module", action="store_true")
    p.add_argument("--no_python", action="store_true")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def local_slots(args):
    """This node's device slots: --include/--exclude on localhost, --num_gpus of them."""
    import torch
    visible = list(range(torch.cuda.device_count())) or [0]  # the CPU: one slot
    slots = visible
    if args.include and args.exclude:
        _error("--include and --exclude are both given; pass one")
    for flag, spec in (("--include", args.include), ("--exclude", args.exclude)):
        if not spec:
            continue
        host, _, listed = spec.partition(":")
        if "@" in spec or host not in ("localhost", socket.gethostname()):
            _error(f"{flag} {spec!r}: only this host's slots can be chosen here "
                   f"('localhost:0,1'); start other hosts with their own command (--no_ssh)")
        chosen = [int(s) for s in listed.split(",")] if listed else visible
        slots = chosen if flag == "--include" else [s for s in visible if s not in chosen]
    if args.num_gpus > 0:
        if torch.cuda.device_count() == 0:
            slots = list(range(args.num_gpus))  # ranks on the CPU
        elif args.num_gpus > len(slots):
            _error(f"--num_gpus {args.num_gpus}: this host has {len(slots)} GPU(s) to use")
        else:
            slots = slots[:args.num_gpus]
    return slots


def plan(args):
    """(world size, first global rank of this node, master address, port)."""
    nodes = max(args.num_nodes, 1)
    if (args.hostfile or nodes > 1) and not args.no_ssh:
        _error("starting other hosts over ssh is not supported; run `zeroshard --no_ssh "
               "--num_nodes M --node_rank N --master_addr HOST0 ...` on each host, or start "
               "the ranks with srun or mpirun")
    if nodes > 1 and not (0 <= args.node_rank < nodes and args.master_addr):
        _error(f"--num_nodes {nodes} with --no_ssh needs --node_rank in [0, {nodes}) and "
               "--master_addr (host 0's address)")
    addr = args.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = args.master_port or int(os.environ.get("MASTER_PORT", 0)) or free_port()
    return nodes, max(args.node_rank, 0), addr, port


def free_port():
    """A port free now and outside the kernel's ephemeral range: one that bind(0) hands
    out can be given to another process's outgoing connection (Gloo's, a store client's)
    before rank 0 listens on it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
    except OSError:
        lo, hi = 32768, 60999
    first, last = (10000, lo - 1) if lo > 11000 else (hi + 1, 65535)
    for _ in range(200):
        port = random.randint(first, last)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{last}")


def command(args, local_rank):
    if args.no_python:
        cmd = [args.user_script]
    elif args.module:
        cmd = [sys.executable, "-u", "-m", args.user_script]
    else:
        cmd = [sys.executable, "-u", args.user_script]
    if not args.no_local_rank:
        cmd.append(f"--local_rank={local_rank}")
    return cmd + args.user_args


def _relay(rank, stream):
    for line in iter(stream.readline, b""):
        sys.stdout.buffer.write(f"[rank{rank}]: ".encode() + line)
        sys.stdout.flush()


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    import torch
    gpus = torch.cuda.device_count() > 0
    slots = local_slots(args)
    nodes, node_rank, addr, port = plan(args)
    per_node = len(slots)
    world = nodes * per_node
    procs, relays = [], []
    for local, slot in enumerate(slots):
        rank = node_rank * per_node + local
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(node_rank),
                   MASTER_ADDR=addr, MASTER_PORT=str(port))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
        p = subprocess.Popen(command(args, local), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((rank, p))
        relays.append(threading.Thread(target=_relay, args=(rank, p.stdout), daemon=True))
        relays[-1].start()
    status = _wait(procs)
    for t in relays:
        t.join(timeout=5)
    return status


def _wait(procs):
    """Every rank's end; the first failure stops the others and is the exit status."""
    running = dict(procs)
    failed = None
    while running:
        for rank, p in list(running.items()):
            code = p.poll()
            if code is None:
                continue
            del running[rank]
            if code != 0 and failed is None:
                failed = code if code > 0 else 128 - code
                print(f"zeroshard: rank {rank} exited with status {code}; stopping the other "
                      f"{len(running)} rank(s)", file=sys.stderr, flush=True)
                for other in running.values():
                    os.killpg(other.pid, signal.SIGTERM)
        if running:
            try:
                next(iter(running.values())).wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    return failed or 0


if __name__ == "__main__":
    sys.exit(main())
