"""zeroshard.comm: deepspeed.comm's names over torch.distributed, so that `import
deepspeed.comm as dist` becomes `import zeroshard.comm as dist`.

Each collective keeps DeepSpeed's signature and runs torch.distributed's collective of
the same name on the default group (or the group given); the engine joins the same
rendezvous. DeepSpeed's communication logger (`prof=True`, `comms_logger`) has no
counterpart here: asking for it is refused rather than dropped."""
import os
from datetime import timedelta

import torch.distributed as _dist
from torch.distributed import ReduceOp  # noqa: F401  (deepspeed.comm.ReduceOp)

from ._common import devices as _devices, launch as _launch, refusals as _refusals
from . import _zeroshard


def _plain(name, prof):
    if prof:
        raise _zeroshard.Error(
            f"zeroshard.comm.{name}(prof=True): DeepSpeed's communication logger has no "
            "counterpart in zeroshard; allowed: prof=False (time the call yourself, or use "
            "torch.profiler)")


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500,
                     verbose=True, timeout=timedelta(minutes=30), init_method=None,
                     dist_init_required=None, config=None, rank=-1, world_size=-1):
    """torch.distributed's default group, as deepspeed.init_distributed makes it: from the
    launcher's environment (torchrun; srun and mpirun's variables too), over `dist_backend`
    (default ZS_DIST_BACKEND's, else NCCL on the CUDA accelerator, else Gloo; NCCL's beside
    Gloo's for host tensors). Nothing happens when the script initialised it already.
    `config` (DeepSpeed's comms options) is refused."""
    if config is not None:
        raise _zeroshard.Error(
            "zeroshard.init_distributed(config=...): DeepSpeed's comms options (comms_logger) "
            "have no counterpart here; allowed: config=None")
    if dist_init_required is False or _dist.is_initialized():
        return
    if rank >= 0:
        os.environ["RANK"] = str(rank)
    if world_size >= 0:
        os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("MASTER_PORT", str(distributed_port))
    _launch.require_launch_env()  # torchrun's, srun's or mpirun's variables
    env = _zeroshard.launch_env()
    backend = dist_backend or _default_backend()
    if backend not in ("nccl", "gloo"):
        named = f"dist_backend={backend!r}" if dist_backend else f"ZS_DIST_BACKEND={backend!r}"
        raise _zeroshard.Error(f"zeroshard.init_distributed: {named}; allowed: 'nccl' (GPUs), "
                               "'gloo' (CPU), None (ZS_DIST_BACKEND's, else by device)")
    # NCCL's for CUDA tensors beside Gloo's for the package's own host collectives.
    _dist.init_process_group(
        _launch.process_group_backend(backend),
        init_method=init_method or f"tcp://{env['master_addr']}:{env['master_port']}",
        rank=env["rank"], world_size=env["world_size"], timeout=timeout)
    _launch.destroy_at_exit()


def _default_backend():
    """ZS_DIST_BACKEND where set (the engine's own groups follow it too: ranks sharing one
    GPU run over Gloo), else NCCL on the CUDA accelerator (DS_ACCELERATOR's, or a GPU
    visible), else Gloo."""
    return os.environ.get("ZS_DIST_BACKEND") or (
        "nccl" if _devices.accelerator_name() == "cuda" else "gloo")


def is_initialized():
    return _dist.is_available() and _dist.is_initialized()


def is_available():
    return _dist.is_available()


def destroy_process_group(group=None):
    _dist.destroy_process_group(group)


def new_group(ranks):
    return _dist.new_group(ranks)


def get_world_group():
    return _dist.group.WORLD


def get_rank(group=None):
    return _dist.get_rank(group) if is_initialized() else int(os.environ.get("RANK", 0))


def get_world_size(group=None):
    return _dist.get_world_size(group) if is_initialized() else \
        int(os.environ.get("WORLD_SIZE", 1))


def get_local_rank():
    return _zeroshard.launch_env()["local_rank"]


def get_global_rank(group=None, group_rank=0):
    return _dist.get_global_rank(group or _dist.group.WORLD, group_rank)


def barrier(group=None, async_op=False, device_ids=None, prof=False, log_name="barrier",
            debug=None):
    _plain("barrier", prof)
    return _dist.barrier(group=group, async_op=async_op, device_ids=device_ids)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False, prof=False,
                      log_name="monitored_barrier", debug=None):
    _plain("monitored_barrier", prof)
    return _dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


def broadcast(tensor, src, group=None, async_op=False, prof=False, log_name="broadcast",
              debug=None):
    _plain("broadcast", prof)
    return _dist.broadcast(tensor, src, group=group, async_op=async_op)


def broadcast_object_list(object_list, src, group=None, device=None, prof=False,
                          log_name="broadcast_object_list", debug=None):
    _plain("broadcast_object_list", prof)
    return _dist.broadcast_object_list(object_list, src, group=group, device=device)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
               log_name="all_reduce", debug=None):
    _plain("all_reduce", prof)
    return _dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
           log_name="reduce", debug=None):
    _plain("reduce", prof)
    return _dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False, prof=False,
               log_name="all_gather", debug=None):
    _plain("all_gather", prof)
    return _dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_object(object_list, obj, group=None, prof=False, log_name="all_gather_object",
                      debug=None):
    _plain("all_gather_object", prof)
    return _dist.all_gather_object(object_list, obj, group=group)


def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False, prof=False,
                           log_name="all_gather_into_tensor", debug=None):
    _plain("all_gather_into_tensor", prof)
    return _dist.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False,
                          prof=False, log_name="reduce_scatter_tensor", debug=None):
    _plain("reduce_scatter_tensor", prof)
    return _dist.reduce_scatter_tensor(output_tensor, tensor, op=op, group=group,
                                       async_op=async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, prof=False,
           log_name="gather", debug=None):
    _plain("gather", prof)
    return _dist.gather(tensor, gather_list, dst, group=group, async_op=async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, prof=False,
            log_name="scatter", debug=None):
    _plain("scatter", prof)
    return _dist.scatter(tensor, scatter_list, src, group=group, async_op=async_op)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, prof=False, log_name="all_to_all_single",
                      debug=None):
    _plain("all_to_all_single", prof)
    return _dist.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes,
                                   group=group, async_op=async_op)


def send(tensor, dst, group=None, tag=0, prof=False, log_name="send", debug=None):
    _plain("send", prof)
    return _dist.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag=0, prof=False, log_name="recv", debug=None):
    _plain("recv", prof)
    return _dist.recv(tensor, src, group=group, tag=tag)


def isend(tensor, dst, group=None, tag=0, prof=False, log_name="isend", debug=None):
    _plain("isend", prof)
    return _dist.isend(tensor, dst, group=group, tag=tag)


def irecv(tensor, src=None, group=None, tag=0, prof=False, log_name="irecv", debug=None):
    _plain("irecv", prof)
    return _dist.irecv(tensor, src, group=group, tag=tag)


def __getattr__(name):
    """A deepspeed.comm name without a counterpart here: said, not an AttributeError."""
    if name.startswith("__"):
        raise AttributeError(name)
    refused = _refusals.refusal(f"comm.{name}")
    if refused is not None:
        raise refused
    raise AttributeError(
        f"zeroshard.comm has no '{name}' (a deepspeed.comm name it does not carry: the "
        "communication logger, MPI discovery helpers and cloud patches have no counterpart); "
        "torch.distributed has the collectives themselves")
