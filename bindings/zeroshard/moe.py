"""zeroshard.moe: deepspeed.moe's names that scripts import, so that
`from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer` (as
DeepSpeedExamples' cifar10_deepspeed.py has it) switches to zeroshard.moe.utils. There are
no expert-parallel parameters here: the split returns the groups as they are, and the MoE
layer is refused by name. (Mixture-of-experts models whose experts are ordinary modules,
transformers' Mixtral or Qwen3-MoE, train at every stage.)"""
import sys
import types

import torch

from . import _zeroshard


def is_moe_param(param):
    """DeepSpeed's mark of an expert-parallel parameter: `allreduce` set to False."""
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_different_moe_groups_for_optimizer(param_groups,
                                                         max_group_size=178956971):
    """deepspeed.moe.utils' split: the groups as a list (one dict becomes a list of it),
    each group's params a list. An expert-parallel parameter is refused: no layer here
    makes one."""
    if isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")
    for group in param_groups:
        group["params"] = list(group["params"])
        if any(is_moe_param(p) for p in group["params"]):
            raise _zeroshard.Error(
                "split_params_into_different_moe_groups_for_optimizer: a parameter is marked "
                "expert-parallel (allreduce=False); zeroshard has no expert parallelism, so "
                "every parameter is sharded over the data-parallel ranks; allowed: parameters "
                "without that mark")
    return param_groups


class MoE(torch.nn.Module):
    """deepspeed.moe.layer.MoE: refused, naming what to use instead."""

    def __init__(self, *args, **kwargs):
        raise _zeroshard.Error(
            "deepspeed.moe.layer.MoE (expert parallelism) is not supported by zeroshard; "
            "allowed: experts as ordinary modules (e.g. a ModuleList of experts and a router, "
            "as transformers' Mixtral and Qwen3-MoE build them), which stage 3 shards like "
            "any other module")


def _submodule(name, **names):
    module = types.ModuleType(f"{__name__}.{name}")
    module.__dict__.update(names)
    sys.modules[module.__name__] = module  # `from zeroshard.moe.utils import ...` finds it
    return module


utils = _submodule("utils", is_moe_param=is_moe_param,
                   split_params_into_different_moe_groups_for_optimizer=(
                       split_params_into_different_moe_groups_for_optimizer))
layer = _submodule("layer", MoE=MoE)
