"""Experts that are DTensors on the "ep" dimension of the mesh given to initialize(mesh=), as
torch-native expert parallelism leaves them (torchtitan's ExpertParallel: each grouped-experts
weight [E, ...] distributed with Shard(0) over the ep ranks, the module's own forward sending
the tokens to their experts' ranks).

Each becomes a plain parameter holding this rank's E / N experts (its local tensor), marked as
DeepSpeed marks expert parameters (allreduce False, group_name "ep_size_N"), and its module is
recorded as split along dim 0 from expert `first` on (zeroshard_expert_parallel, as
hf_expert_parallel.py records AutoEP's): the engine then reduces and shards the experts over
the ranks holding the same ones, checkpoints keep them as parts of the whole weight, and the
state_dict joins them. While the module runs it sees the DTensors again (dtensor.py's
wrapping), so the model computes as the user parallelized it; the dispatch is the model's."""
import torch

from .. import _zeroshard
from .._common import expert_groups
from .._parallel.dtensor import DTensor, Shard, _Wrapped, installer

EP = "ep"


def _error(message):
    return _zeroshard.Error(f"zeroshard.initialize: mesh: {message}")


def unwrap(model, mesh):
    """(ep size, the mesh left for tensor parallelism, install) where `mesh` has an ep
    dimension (the last: consecutive ranks per ep group, as the engine lays expert groups
    out) beside data-parallel ones, whose ranks the engine shards over itself (None left);
    (0, mesh, None) where it has none. install() puts the DTensors back in front of each
    module's forward (called once the engine holds the parameters)."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if DTensor is None or EP not in names:
        return 0, mesh, None
    others = [n for n in names if n != EP and mesh[n].size() > 1]
    if names[-1] != EP or any(n not in ("dp", "dp_shard", "dp_replicate", "efsdp")
                              for n in others):
        raise _error(f"dimensions {names}: the ep dimension must be the last, beside "
                     "data-parallel ones (consecutive ranks per expert-parallel group, as "
                     "DeepSpeed lays them out); allowed: init_device_mesh(device, (dp, ep), "
                     "mesh_dim_names=('dp', 'ep'))")
    ep_mesh, size = mesh[EP], mesh[EP].size()
    found = {}  # module: [(name, DTensor)]
    for module in model.modules():
        for name, p in module._parameters.items():
            if isinstance(p, DTensor) and p.device_mesh == ep_mesh:
                found.setdefault(module, []).append((name, p))
    if not found:
        raise _error(f"it has an ep dimension of {size} ranks, but no parameter is a DTensor "
                     "on it; allowed: experts distributed over mesh['ep'] with Shard(0)")
    group_name = expert_groups.make(size)  # DeepSpeed's getters and groups, as its layer's
    place = ep_mesh.get_local_rank()
    wrapped = {}
    for module, params in found.items():
        experts = {tuple(p.placements) == (Shard(0),) and p.shape[0] for _, p in params}
        if len(experts) != 1 or not all(experts) or next(iter(experts)) % size:
            raise _error(
                f"{type(module).__name__}'s parameters {[n for n, _ in params]} on the ep "
                f"dimension are {[(tuple(p.shape), tuple(p.placements)) for _, p in params]}; "
                f"allowed: Shard(0) of one expert count that {size} divides")
        local = next(iter(experts)) // size
        for name, p in params:
            mine = torch.nn.Parameter(p.to_local().detach(), requires_grad=p.requires_grad)
            mine.allreduce = False  # DeepSpeed's mark of an expert parameter
            mine.group_name = group_name
            module._parameters[name] = mine
            wrapped.setdefault(module, _Wrapped(None)).params.append(
                (name, ep_mesh, tuple(p.placements), p.shape, p.stride()))
        module.zeroshard_expert_parallel = (ep_mesh.get_group(), size, place * local,
                                            tuple(n for n, _ in params))
    return size, None, installer(wrapped)
