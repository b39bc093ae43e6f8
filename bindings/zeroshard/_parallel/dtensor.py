"""DTensor parameters, as torch's parallelize_module leaves them over a tensor-parallel mesh
(FSDP2's way in; torchtitan's plans): each becomes a plain parameter holding its local
tensor, which the engine shards over the data-parallel ranks like any other, split ones
marked as Megatron marks them (tensor_model_parallel, partition_dim). While its module
runs, the module sees the DTensor again, made from that local tensor (DTensor.from_local,
whose backward hands the local gradient back; a replicated parameter's partial gradients
are summed across the tp ranks first), so the model computes as the user parallelized it."""
import weakref

import torch

from .. import _zeroshard
from .tensor_parallel import _error

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # torch without DTensor: no parameter is one
    DTensor = None


class _Wrapped:
    """One module's DTensor parameters: (name, mesh, placements, shape, stride).
    `local_when(module)`: the module's forward takes its local tensors then (transformers'
    Linear layers without autograd)."""

    def __init__(self, local_when):
        self.params = []
        self.local_when = local_when

    def before(self, module, _args):
        if self.local_when is not None and self.local_when(module):
            return
        for name, mesh, placements, shape, stride in self.params:
            local = module._parameters[name]
            module.__dict__[name] = DTensor.from_local(local, mesh, placements, run_check=False,
                                                       shape=shape, stride=stride)

    def after(self, module, _args, _output):
        for name, *_ in self.params:
            module.__dict__.pop(name, None)


def _split_dim(name, p):
    """The dimension a parameter is split along, None where it is whole, refused where its
    placement is not one zeroshard can shard."""
    if p.device_mesh.ndim != 1:
        raise _error(
            f"parameter '{name}' is a DTensor over a {p.device_mesh.ndim}-D mesh "
            f"{tuple(p.device_mesh.mesh_dim_names or ())}; allowed: parameters over the 1-D "
            "tensor-parallel mesh (parallelize_module(model, mesh['tp'], plan)); zeroshard "
            "shards over the data-parallel dimension itself (do not apply fully_shard)")
    placement = p.placements[0]
    if isinstance(placement, Replicate):
        return None
    if isinstance(placement, Shard):
        dim, size = placement.dim % p.dim(), p.device_mesh.size()
        if p.shape[dim] % size != 0:  # every tp rank's slice alike: checkpoints, state_dict
            raise _error(
                f"parameter '{name}' of shape {tuple(p.shape)} is split along dimension {dim} "
                f"over {size} tensor-parallel ranks, unevenly; allowed: a dimension the "
                "tensor-parallel size divides")
        return dim
    raise _error(f"parameter '{name}' has placement {placement}; allowed: Shard or Replicate")


def _tp_mesh(found, mesh):
    """The one tensor-parallel mesh of every DTensor parameter, checked against the engine's
    layout (tp ranks consecutive) and against `mesh` when the user gave one."""
    env = _zeroshard.launch_env()
    rank, world = env["rank"], env["world_size"]
    tp_mesh = found[0][2].device_mesh
    for name, _, p in found:
        if p.device_mesh != tp_mesh:
            raise _error(f"parameter '{name}' is over another mesh than '{found[0][0]}'; "
                         "allowed: every DTensor parameter over the same tensor-parallel mesh")
    ranks = tp_mesh.mesh.flatten().tolist()
    size = len(ranks)
    start = rank - rank % size
    if world % size != 0 or ranks != list(range(start, start + size)):
        raise _error(
            f"the parameters' mesh puts rank {rank} of {world} with ranks {ranks}; zeroshard "
            "lays ranks out as init_device_mesh(..., (dp, tp), mesh_dim_names=('dp', 'tp')) "
            f"does: allowed: ranks {list(range(start, start + size))}")
    if mesh is not None:
        names = tuple(mesh.mesh_dim_names or ())
        tp_name = (tp_mesh.mesh_dim_names or (None,))[0]
        if mesh.ndim != 2 or tp_name not in names or names.index(tp_name) != 1 or \
                mesh.size() != world:
            raise _error(
                f"mesh: {mesh.ndim}-D with dimensions {names} over {mesh.size()} ranks; "
                f"allowed: a 2-D mesh of the {world} ranks whose last dimension is the "
                f"parameters' tensor-parallel one ('{tp_name}'), the first the data-parallel one")
    return size


def unwrap(model, mesh=None, local_when=None):
    """Replaces every DTensor parameter of `model` by its local tensor. Returns (tp size,
    {name: dimension} of the split parameters, install): install() puts the DTensors back
    in front of each module's forward (called once the engine holds the parameters).
    (0, {}, None) when the model has no DTensor parameter."""
    if DTensor is None:
        return 0, {}, None
    found, seen = [], set()
    for module_name, module in model.named_modules():
        for name, p in module._parameters.items():
            if isinstance(p, DTensor) and id(p) not in seen:
                seen.add(id(p))
                found.append((f"{module_name}.{name}" if module_name else name, module, p))
    if not found:
        if mesh is not None:
            raise _error("mesh is given, but no parameter is a DTensor; allowed: a model "
                         "parallelize_module has split over the mesh's tensor-parallel dimension")
        return 0, {}, None
    size = _tp_mesh([(n, m, p) for n, m, p in found], mesh)
    locals_, split, wrapped = {}, {}, {}
    for name, _, p in found:
        dim = _split_dim(name, p)
        local = torch.nn.Parameter(p.to_local().detach(), requires_grad=p.requires_grad)
        if dim is not None:
            local.tensor_model_parallel, local.partition_dim = True, dim
            split[name] = dim
        locals_[id(p)] = (local, p.device_mesh, tuple(p.placements), p.shape, p.stride())
    for module in model.modules():  # every module holding one, tied ones too
        for pname, p in list(module._parameters.items()):
            if id(p) in locals_:
                local, tp_mesh, placements, shape, stride = locals_[id(p)]
                module._parameters[pname] = local
                wrapped.setdefault(module, _Wrapped(local_when)).params.append(
                    (pname, tp_mesh, placements, shape, stride))
    if len(split) == 0:
        raise _error(f"every DTensor parameter is replicated over the {size} tensor-parallel "
                     "ranks; allowed: a plan that splits some (ColwiseParallel, RowwiseParallel)")

    return size, split, installer(wrapped)


def installer(wrapped):
    """install() for {module: _Wrapped}: the hooks that put each module's DTensors back in
    front of its forward and take them away after it; returns them."""
    def install():
        hooks = []
        for module, w in wrapped.items():
            hooks.append(module.register_forward_pre_hook(w.before))
            hooks.append(module.register_forward_hook(w.after, always_call=True))
        return hooks
    return install


def places(model):
    """{id(parameter): (the parameter, held weakly; module, name)} for every parameter of
    `model`: where to find what replaced it once it is split (a DTensor) and unwrapped (its
    local tensor). The weak reference tells a parameter from a later one at its address."""
    return {id(p): (weakref.ref(p), module, name) for module in model.modules()
            for name, p in module._parameters.items() if p is not None}


def retarget(optimizer, model_parameters, places):
    """A client optimizer's param_groups (and model_parameters, returned) made over the
    parameters now at the places the ones they held were: an optimizer built before the
    model was split, or over its DTensors, names the engine's parameters."""
    def now(p):
        place = places.get(id(p))
        if place is None or place[0]() is not p:
            return p
        return place[1]._parameters[place[2]]

    if isinstance(optimizer, torch.optim.Optimizer):  # not DeepSpeed's callable form
        for group in optimizer.param_groups:
            group["params"] = [now(p) for p in group["params"]]
    if model_parameters is None:
        return None
    items = list(model_parameters)
    return [dict(g, params=[now(p) for p in g["params"]]) if isinstance(g, dict) else now(g)
            for g in items]
