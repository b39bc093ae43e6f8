"""Stage 3's units for an nn.Module: the model described as engine/UnitPartition.h's module
tree and cut by the same C++ rule the LibTorch Engine uses, so both languages shard alike.
Every parameter lands in exactly one unit; a unit lists the modules whose forward gathers
it (several for a head tied to the embedding)."""
import torch

from .. import _zeroshard

_STACKS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


def unique_parameters(model):
    """(name, parameter) in named_parameters() order, a tied parameter once."""
    seen, out = set(), []
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def _callable(module):
    """Whether the module has a forward of its own (ModuleList, ModuleDict and the
    parameter containers do not: their parameters are read by their parent's forward)."""
    return type(module).forward is not torch.nn.Module.forward


def module_tree(model, params):
    """(nodes, modules): node i is modules[i] as (children, own parameter indices, stack,
    callable); a module under two parents is one node. `params` as unique_parameters."""
    index = {id(p): i for i, (_, p) in enumerate(params)}
    nodes, modules, node_of = [], [], {}
    pending = [(model, None)]  # (module, parent node)
    while pending:
        module, parent = pending.pop()
        n = node_of.get(id(module))
        if n is None:
            n = node_of[id(module)] = len(nodes)
            modules.append(module)
            own = [index[id(p)] for p in module._parameters.values() if p is not None]
            nodes.append(([], own, isinstance(module, _STACKS), _callable(module)))
            kids = [c for c in module._modules.values() if c is not None]
            pending.extend((c, n) for c in reversed(kids))
        if parent is not None:
            nodes[parent][0].append(n)
    return nodes, modules


def stage3_units(model, declared=None):
    """[(modules, [(name, parameter)])] per unit, in the order of their first module.
    `declared`: modules (or names from named_modules()) that are units; every parameter
    outside them is sharded too, by the default rule for what is left."""
    params = unique_parameters(model)
    nodes, modules = module_tree(model, params)
    node_of = {id(m): i for i, m in enumerate(modules)}
    by_name = dict(model.named_modules())
    chosen = []
    for u in declared or ():
        if isinstance(u, str):
            if u not in by_name:
                raise _zeroshard.Error(
                    f"units: '{u}' is not a submodule of the model; allowed: names from "
                    "model.named_modules() or module objects")
            u = by_name[u]
        if id(u) not in node_of:
            raise _zeroshard.Error(
                f"units: a {type(u).__name__} that is not a submodule of the model; allowed: "
                "modules the model registers, or their names")
        chosen.append(node_of[id(u)])
    units = _zeroshard.partition_units(nodes, len(params), chosen)
    return [([modules[m] for m in mods], [params[p] for p in ps]) for mods, ps in units]


# DeepSpeed's weight_quantization quantizes the weight of exactly these classes (its
# WEIGHT_QUANTIZATION_LAYERS, matched by type, not by subclass).
_QUANTIZED_LAYERS = (torch.nn.Linear, torch.nn.Embedding)


def quantizable_names(model, params):
    """Names (as unique_parameters gives them) of the weights weight_quantization codes."""
    wanted = {id(m.weight) for m in model.modules()
              if type(m) in _QUANTIZED_LAYERS and isinstance(m.weight, torch.nn.Parameter)}
    return {name for name, p in params if id(p) in wanted}
