"""The launch as torch.distributed and the engine meet it: the launcher's environment,
torch.distributed's process group at its rendezvous, and whether the script already
serves the rendezvous store."""
import atexit
import gc
import os
import sys
import threading
import time

import torch.distributed as dist

from .. import _zeroshard
from . import devices

LAUNCH_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def require_launch_env():
    if any(v in os.environ for v in LAUNCH_VARS):
        return
    raise _zeroshard.Error(
        "zeroshard.initialize: no process-group environment (none of RANK from torchrun, "
        "SLURM_PROCID from srun, OMPI_COMM_WORLD_RANK from mpirun is set); start the script "
        "with `torchrun --nproc_per_node N script.py`, `./zs run -n N script.py`, srun or "
        "mpirun, or for one process set RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "
        "MASTER_PORT=29500")


def store_already_served():
    """True when torch.distributed, initialised in this process (by the script,
    deepspeed.init_distributed, accelerate, the Hugging Face Trainer), serves the
    rendezvous store at MASTER_PORT, where zeroshard's rank 0 would listen: every rank
    then joins that store as a client (its keys under their own prefix)."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # torch's PrefixStores
        store = store.underlying_store
    port = getattr(store, "port", None)
    return port is None or port == _zeroshard.launch_env()["master_port"]


def process_group_backend(name=None):
    """The backend torch.distributed starts with: Gloo's for host tensors always (the
    package's own collectives on the host: construction's broadcasts, object exchanges),
    and NCCL's for CUDA tensors where `name` asks for NCCL, or, by default, where the
    process trains on a GPU (DeepSpeed's initialize starts NCCL there) unless
    ZS_DIST_BACKEND=gloo (ranks sharing one GPU)."""
    if name is None:
        name = os.environ.get("ZS_DIST_BACKEND") or (
            "nccl" if devices.accelerator_name() == "cuda" else "gloo")
    return "cpu:gloo,cuda:nccl" if name == "nccl" else name


def init_distributed():
    """torch.distributed at the launch's rendezvous (process_group_backend), unless the
    script did it."""
    if dist.is_initialized():
        return
    backend = process_group_backend()
    env = _zeroshard.launch_env()
    if _zeroshard.engine_serves_rendezvous():
        # An earlier engine's rank 0 serves the store at MASTER_PORT for the whole process:
        # every rank joins it as a client, torch.distributed's keys under a prefix of their own.
        where = (env["master_addr"], env["master_port"], env["world_size"])
        try:
            store = dist.TCPStore(*where, is_master=False)
        except RuntimeError as e:  # a torch built without libuv (Debian's 2.6) asks for it
            if "libuv" not in str(e):
                raise
            store = dist.TCPStore(*where, is_master=False, use_libuv=False)
        dist.init_process_group(backend, store=dist.PrefixStore("torch.distributed/", store),
                                rank=env["rank"], world_size=env["world_size"])
    else:
        dist.init_process_group(
            backend, init_method=f"tcp://{env['master_addr']}:{env['master_port']}",
            rank=env["rank"], world_size=env["world_size"])
    destroy_at_exit()


_forget_at_exit = []


def destroy_at_exit():
    """For a torch.distributed this package started: its groups go at exit (below)."""
    atexit.unregister(_destroy_at_exit)
    atexit.register(_destroy_at_exit)


def quiet_at_exit():
    """For an engine on a torch.distributed the script started: quiet_threads at exit."""
    atexit.unregister(quiet_threads)
    atexit.register(quiet_threads)


def forget_at_exit(forget):
    """forget() drops a module's references to process groups, at exit (_destroy_at_exit)."""
    _forget_at_exit.append(forget)


def quiet_threads(limit_s=2.0):
    """Waits, the GIL let go, until no other thread of this process is running (at most
    `limit_s`). A Gloo group's worker thread releases a collective's tensors just after
    the collective completes; a tensor whose Python object was dropped meanwhile is freed
    there, and that takes the GIL. Taken while the interpreter finalizes, the GIL ends the
    thread (pthread_exit), and unwinding through Gloo's loop aborts the process ("terminate
    called without an active exception", exit status -6, after a run that succeeded: seen
    on loaded machines, where that thread had not run yet when the rank exited); taken
    while a group is destroyed under the GIL, it deadlocks. Run at exit, this lets such a
    thread finish first."""
    me = str(threading.get_native_id())
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(0.005)
        try:
            tasks = [t for t in os.listdir("/proc/self/task") if t != me]
        except OSError:
            return
        if not any(_running(t) for t in tasks):
            return


def _running(task):
    try:
        with open(f"/proc/self/task/{task}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, IndexError):
        return False


def _destroy_at_exit():
    """torch.distributed started here is torn down here, at exit while the interpreter is
    whole: the groups' threads quiet first (quiet_threads says why), then the references
    zeroshard's modules keep are dropped and torch.distributed's registry emptied, so that
    a group the script does not hold is destroyed now, its threads joined, and not in the
    interpreter's last teardown. Not after an uncaught exception (sys.last_value): its
    peers may still be inside a collective with this rank, and the teardown would wait for
    them."""
    if getattr(sys, "last_value", None) is not None or not dist.is_initialized():
        return
    quiet_threads()
    for forget in _forget_at_exit:
        forget()
    dist.destroy_process_group()
    gc.collect()  # groups held only in cycles go now too
