"""The `zeroshard` command (and `python -m zeroshard`): DeepSpeed's launcher's flags,
so that `deepspeed --num_gpus 2 train.py ARGS` becomes `zeroshard --num_gpus 2 train.py
ARGS`. It starts this node's ranks as plain processes with the environment torchrun
gives (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and, as
DeepSpeed's launcher does, `--local_rank=N` before the script's arguments. Each line a
rank prints is shown with its rank; when a rank fails the others are stopped and the
command exits with that rank's status.

Design notes.
- Several hosts, as DeepSpeed does: a --hostfile (bindings/zeroshard/_tools/hostfile.py) names
  them and their slots; this command logs into each over ssh (`ssh -tt -o BatchMode=yes`,
  --ssh_port, and PDSH_SSH_ARGS_APPEND's options, as DeepSpeed's pdsh runner takes
  them) and runs itself there with the hosts' layout (--world_info) and that host's
  --node_rank, in the same directory, with the environment DeepSpeed exports (NCCL_*,
  PYTHON*, UCX_*, ..., ZS_*, and the lines of .deepspeed_env in the home and current
  directories). The first host's name is the rendezvous address. The pseudo-terminal
  (-tt) makes a host's command end when its ssh connection does; a host's command that
  ends stops its ranks.
- With --no_ssh every host runs the command itself with its own --node_rank and the same
  --num_nodes (or --hostfile) and --master_addr (DeepSpeed's no-ssh mode).
- The rendezvous port: --master_port if given, else MASTER_PORT if set, else a free one
  on this host (a fixed default makes two jobs on one machine collide).
"""
import argparse
import base64
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading

from . import hostfile as _hostfile

# What DeepSpeed's runner exports to the other hosts, by prefix, and whole names.
_EXPORTED_PREFIXES = ("NCCL_", "PYTHON", "MV2_", "UCX_", "MLFLOW", "ZS_", "GLOO_", "TORCH_")
_EXPORTED = ("OMP_NUM_THREADS", "USE_LIBUV")
ENV_FILE = ".deepspeed_env"
_OTHER_LAUNCHERS = ("openmpi", "mpich", "impi", "mvapich", "slurm")
_relays = []  # the threads showing each rank's (host's) lines


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
    p.add_argument("--ssh_port", type=int, default=None)
    p.add_argument("--launcher", default="pdsh")
    # The hosts' layout, given by the command that reached this host over ssh.
    p.add_argument("--world_info", default="", help=argparse.SUPPRESS)
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


def _port(args):
    return args.master_port or int(os.environ.get("MASTER_PORT", 0)) or free_port()


def _resources(args):
    try:
        return _hostfile.resources(_hostfile.read(args.hostfile), args.include, args.exclude,
                                   args.num_nodes, args.num_gpus)
    except _hostfile.HostfileError as e:
        _error(str(e))


def layout(args):
    """(this node's slots, world size, first global rank here, master address, port)."""
    port = _port(args)
    hosts = None
    if args.world_info:  # reached over ssh by the command on the first host
        hosts = json.loads(base64.urlsafe_b64decode(args.world_info))
    elif args.hostfile:  # --no_ssh: each host runs this command with its --node_rank
        hosts = _resources(args)
    if hosts is None:
        nodes = max(args.num_nodes, 1)
        if nodes > 1 and not args.no_ssh:
            _error(f"--num_nodes {nodes}: name the hosts in a --hostfile ('HOSTNAME slots=N' "
                   "lines), which this command reaches over ssh; or run `zeroshard --no_ssh "
                   "--num_nodes M --node_rank N --master_addr HOST0 ...` on each host")
        if nodes > 1 and not (0 <= args.node_rank < nodes and args.master_addr):
            _error(f"--num_nodes {nodes} with --no_ssh needs --node_rank in [0, {nodes}) and "
                   "--master_addr (host 0's address)")
        slots = local_slots(args)
        addr = args.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
        return slots, nodes * len(slots), max(args.node_rank, 0) * len(slots), addr, port
    names = list(hosts)
    if not 0 <= args.node_rank < len(names):
        _error(f"--node_rank {args.node_rank}: the hostfile has hosts 0..{len(names) - 1} "
               f"({', '.join(names)})")
    counts = [len(hosts[h]) for h in names]
    addr = args.master_addr or names[0]
    return (hosts[names[args.node_rank]], sum(counts), sum(counts[:args.node_rank]), addr,
            port)


def _exported_env():
    """What the other hosts get of this one's environment, as DeepSpeed's runner sends it."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(_EXPORTED_PREFIXES) or k in _EXPORTED}
    for folder in (os.path.expanduser("~"), os.getcwd()):
        path = os.path.join(folder, ENV_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                for line in f:
                    key, sep, value = line.strip().partition("=")
                    if sep and key and not key.startswith("#"):
                        env[key] = value
    return env


def _over_ssh(args):
    """Runs this command on every host of the hostfile over ssh; the first host's failure
    stops the others and is the exit status."""
    if args.launcher not in ("pdsh", "ssh"):
        why = ("start the ranks with that launcher itself (zeroshard's ranks read its "
               "environment)" if args.launcher in _OTHER_LAUNCHERS else "it is not known")
        _error(f"--launcher {args.launcher}: {why}; allowed: pdsh or ssh (each host reached "
               "over ssh)")
    hosts = _resources(args)
    addr = args.master_addr or next(iter(hosts))
    port = _port(args)
    info = base64.urlsafe_b64encode(json.dumps(hosts).encode()).decode()
    flags = [f for f, on in (("--module", args.module), ("--no_python", args.no_python),
                             ("--no_local_rank", args.no_local_rank)) if on]
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in _exported_env().items())
    ssh = ["ssh", "-tt", "-o", "BatchMode=yes"]
    ssh += ["-p", str(args.ssh_port)] if args.ssh_port else []
    ssh += shlex.split(os.environ.get("PDSH_SSH_ARGS_APPEND", ""))
    procs = []
    for node, host in enumerate(hosts):
        remote = [sys.executable, "-u", "-m", "zeroshard", "--no_ssh", "--world_info", info,
                  "--node_rank", str(node), "--master_addr", addr, "--master_port", str(port)]
        remote += flags + [args.user_script] + args.user_args
        line = (f"cd {shlex.quote(os.getcwd())} && exec env {exports} "
                + " ".join(shlex.quote(w) for w in remote))
        procs.append((host, _start(ssh + [host, line], None, host)))
    return _wait(procs, "host")


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


def _relay(prefix, stream):
    for line in iter(stream.readline, b""):
        # A host's lines come through its pseudo-terminal, ending in CR LF.
        sys.stdout.buffer.write(prefix + line.replace(b"\r\n", b"\n"))
        sys.stdout.flush()


def _start(cmd, env, name, prefix=b""):
    """`cmd` in a session of its own (so that it can be stopped with what it started),
    its output relayed line by line; `env` None: this one's environment."""
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    relay = threading.Thread(target=_relay, args=(prefix, p.stdout), daemon=True, name=name)
    relay.start()
    _relays.append(relay)
    return p


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.hostfile and not args.no_ssh and not args.world_info:
        return _over_ssh(args)
    import torch
    gpus = torch.cuda.device_count() > 0
    slots, world, first, addr, port = layout(args)
    procs = []
    for local, slot in enumerate(slots):
        rank = first + local
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(len(slots)), GROUP_RANK=str(max(args.node_rank, 0)),
                   MASTER_ADDR=addr, MASTER_PORT=str(port))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
        procs.append((rank, _start(command(args, local), env, f"rank{rank}",
                                   f"[rank{rank}]: ".encode())))
    return _wait(procs, "rank")


def _stop(procs):
    for _, p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _wait(procs, what):
    """Every rank's (or host's) end; the first failure stops the others and is the exit
    status. This command stopped (SIGTERM, or SIGHUP: its ssh connection gone) stops them."""
    def stopped(signum, _frame):
        _stop(procs)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGHUP, stopped)
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
                how = " (ssh could not reach it, or lost it)" if what == "host" and code == 255 \
                    else ""
                print(f"zeroshard: {what} {rank} exited with status {code}{how}; stopping the "
                      f"other {len(running)} {what}(s)", file=sys.stderr, flush=True)
                _stop(running.items())
        if running:
            try:
                next(iter(running.values())).wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    for relay in _relays:  # their last lines
        relay.join(timeout=5)
    return failed or 0


if __name__ == "__main__":
    sys.exit(main())
