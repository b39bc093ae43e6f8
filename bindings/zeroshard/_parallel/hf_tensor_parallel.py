"""DeepSpeed's `tensor_parallel.autotp_size` for a transformers model: the model's own
tp_plan (its `base_model_tp_plan`, as from_pretrained(tp_plan="auto") applies it) laid over
the "tp" dimension of a ("dp", "tp") mesh, by transformers itself. The parameters come out as
DTensors, which bindings/zeroshard/_parallel/dtensor.py hands to the engine as their local tensors."""
import torch
import torch.distributed as dist

from .._common import launch as _launch
from .tensor_parallel import _error, check_autotp_mpu


def split_by_plan(model, loaded, mpu, mesh):
    """(mesh, local_when, mpu) for the engine: where the config's tensor_parallel.autotp_size
    asks for it (no mesh given, no parameter split by the model's own layers), the model
    split by its tp_plan; a script's mpu (DeepSpeed's AutoTP example passes one) checked to
    hold the plan's groups, and then done with."""
    marked = any(getattr(p, "tensor_model_parallel", False) for p in model.parameters())
    if loaded.tensor_parallel_size <= 1 or mesh is not None or marked:
        return mesh, None, mpu
    if mpu is not None:
        check_autotp_mpu(mpu, loaded.tensor_parallel_size)
    mesh, local_when = apply_plan(model, loaded.tensor_parallel_size,
                                  loaded.pipeline_parallel_size)
    return mesh, local_when, None


def apply_plan(model, tp, stages=1):
    """Splits `model` by its tp_plan over tp ranks; returns (the mesh, the rule for when a
    split module runs on its local tensors, as transformers' own layers decide)."""
    if stages > 1:
        raise _error(
            f"config key 'tensor_parallel.autotp_size' is {tp} with pipeline.stages {stages}: "
            "a model's own tp_plan is laid over every rank, not over one stage's; allowed: one "
            "of the two, or a Megatron-style model with an mpu that has both (initialize(mpu=))")
    plan = getattr(model, "tp_plan", None) if hasattr(model, "config") else None
    if not plan:
        raise _error(
            f"config key 'tensor_parallel.autotp_size' is {tp}, but the model "
            f"({type(model).__name__}) carries no tp_plan; allowed: a transformers model whose "
            "class has one (Llama, Qwen, Mistral, ...), a model split by parallelize_module "
            "(pass mesh=), or a Megatron-style model (pass mpu=)")
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from transformers.distributed.tensor_parallel import (ALL_PARALLEL_STYLES,
                                                              _get_parameter_tp_plan,
                                                              apply_tensor_parallelism)
    except ImportError as e:
        raise _error(f"tensor_parallel.autotp_size {tp}: this transformers has no DTensor "
                     f"tensor-parallel API ({e}); allowed: transformers >= 5") from None
    _launch.init_distributed()
    world = dist.get_world_size()
    if world % tp != 0:
        raise _error(f"config key 'tensor_parallel.autotp_size' is {tp}, which does not divide "
                     f"the {world} ranks")
    # Every rank slices the same whole model (transformers slices each rank's own values):
    # rank 0's, as DDP's construction starts every rank from rank 0's.
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0)
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    apply_tensor_parallelism(model, mesh["tp"])
    # Where a style's forward takes local tensors (a Linear without autograd), the module
    # is given its local ones.
    styles = {}
    for name, module in model.named_modules():
        style = _get_parameter_tp_plan(parameter_name=name, tp_plan=plan, is_weight=False)
        if style in ALL_PARALLEL_STYLES:
            styles[module] = ALL_PARALLEL_STYLES[style]

    def local_when(module):
        style = styles.get(module)
        return style is not None and style.should_use_local_tensors(module)

    return mesh, local_when


def slice_numels(model, tp):
    """{id(parameter): elements of one rank's slice} for the parameters `model`'s tp_plan
    splits over tp ranks, as transformers' styles split them (colwise ones weight and bias,
    rowwise ones the weight, the bias whole); None where the model has no tp_plan. For the
    estimator: nothing is split."""
    plan = getattr(model, "tp_plan", None) if hasattr(model, "config") else None
    if not plan:
        return None
    from transformers.distributed.tensor_parallel import _get_parameter_tp_plan
    out = {}
    for name, p in model.named_parameters():
        style = _get_parameter_tp_plan(parameter_name=name, tp_plan=plan, is_weight=True) or ""
        split = "colwise" in style or ("rowwise" in style and not name.endswith(".bias"))
        if split:
            out[id(p)] = -(-p.numel() // tp)
    return out
