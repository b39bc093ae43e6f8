"""zeroshard.estimate: what fits where for a real model, before launch, from the same
Planner as the zeroshard-estimate CLI."""
import os

from .._common import config as _config
from .._parallel import hf_tensor_parallel as _hf_tensor_parallel
from .. import _zeroshard
from .._activations.shapes import model_shape
from .._engine.units import stage3_units


def _count(params, numel=lambda p: p.numel()):
    seen, total = set(), 0
    for p in params:
        if id(p) not in seen:  # shared (tied) parameters once
            seen.add(id(p))
            total += numel(p)
    return total


def _already_split(p):
    return getattr(p, "tensor_model_parallel", False) or hasattr(p, "to_local")


def _rank_numel(model, tp):
    """Elements one tensor-parallel rank holds of each parameter: a model split already
    (DTensor parameters, or Megatron's tensor_model_parallel marks) as it is, a transformers
    model by its own tp_plan (as tensor_parallel.autotp_size splits it)."""
    if tp == 1:
        return lambda p: p.numel()
    if any(_already_split(p) for p in model.parameters()):
        return lambda p: p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    slices = _hf_tensor_parallel.slice_numels(model, tp)
    if slices is None:
        raise ValueError(
            f"estimate: tp={tp}, but the model ({type(model).__name__}) carries no tp_plan and "
            "no parameter is split; allowed: a transformers model whose class has one (Llama, "
            "Qwen, Mistral, ...), a model split already (parallelize_module, or Megatron-style "
            "layers marking tensor_model_parallel), or tp=1")
    return lambda p: slices.get(id(p), p.numel())


def estimate(model, config=None, nodes=1, gpus_per_node=1, gpu_memory="80GB",
             host_memory=None, nvme=None, units=None, seq=None, micro_batch=1,
             activation_checkpointing=None, tp=None, inference=False, bandwidths=None):
    """Returns the plan as a dict: summary, recommended option, per-option bytes per rank
    per tier, and the resolved config YAML.

    With `seq`, the device bytes include the activations of a micro-batch of `micro_batch`
    sequences of `seq` tokens, from the model's Hugging Face config (its family as
    zeroshard-estimate reads config.json, and the attention the model was built with),
    checkpointed where `activation_checkpointing` says (default: where the model has
    gradient checkpointing on); without it they are left out, and the result's
    `activations` says so.

    With `tp` (default: the config's tensor_parallel.autotp_size) the bytes are one rank's of
    tp tensor-parallel ranks inside a node, ZeRO over the nodes * gpus_per_node / tp others:
    a transformers model split by its own tp_plan, a model split already as it is.

    With `inference=True` the model is planned as zeroshard.init_inference serves it (every
    weight frozen, stage 3): `micro_batch` sequences per rank whose KV cache holds `seq`
    tokens each (prompt and generated), `kv_cache_bytes` in the result, and each option's
    `stream`: the bytes a rank reads per decoding step from the device, host RAM and NVMe
    and the tokens/s those reads allow at `bandwidths` ({"device", "host_link", "nvme"}:
    bytes per second or sizes such as "25GB"; defaults as zeroshard-estimate --inference)."""
    # Without a config serving is open to every tier the weights may rest in.
    open_tiers = ('{"zero_optimization": {"offload_param": {"device": "auto"}, '
                  '"offload_optimizer": {"device": "auto"}}}')
    loaded = (_config.parse(config) if config is not None
              else _config.parse_text(open_tiers if inference else "{}", "no config"))
    configured = loaded.tensor_parallel_size
    if tp is None:
        tp = configured
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"estimate: tp={tp!r} is not allowed; allowed: a positive integer")
    if configured > 1 and tp != configured:
        raise ValueError(f"estimate: tp={tp} contradicts the config's "
                         f"tensor_parallel.autotp_size {configured}; give one of them")
    if inference and activation_checkpointing:
        raise ValueError("estimate: activation_checkpointing is for training; with "
                         "inference=True nothing is kept for backward")
    if not inference and bandwidths is not None:
        raise ValueError("estimate: bandwidths are a serving figure; give them with "
                         "inference=True")
    rates = {name: float(_bytes(rate, f"bandwidths['{name}']"))
             for name, rate in (bandwidths or {}).items()}
    numel = _rank_numel(model, tp)
    unit_counts = [_count((p for _, p in ps), numel) for _, ps in stage3_units(model, units)]
    total = _count(model.parameters(), numel)
    host = host_memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    shape = _activation_shape(model, seq, micro_batch, activation_checkpointing)
    if inference and shape:
        shape["activation_checkpointing"] = False  # nothing is recomputed: no backward
    plan = _zeroshard.plan(total, unit_counts, max(unit_counts or [total]), loaded, nodes,
                           gpus_per_node, _bytes(gpu_memory, "gpu_memory"),
                           _bytes(host, "host_memory"), _bytes(nvme, "nvme"),
                           tensor_parallel=tp, inference=bool(inference), bandwidths=rates,
                           **shape)
    plan["activations"] = ("counted" if shape else
                           "not counted: pass seq= (and micro_batch=) to count them")
    return plan


def _activation_shape(model, seq, micro_batch, activation_checkpointing):
    """The plan's keywords for activations: the model's config as JSON and the batch."""
    if seq is None:
        return {}
    hf = getattr(model, "config", None)
    if hf is None or not hasattr(hf, "to_json_string"):
        raise ValueError(
            f"estimate: seq={seq} needs the model's shape, read from a Hugging Face config "
            f"(model.config); {type(model).__name__} has none. Allowed: a transformers model, "
            "or leave seq out to plan without activations")
    for name, value in (("seq", seq), ("micro_batch", micro_batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"estimate: {name}={value!r} is not allowed; allowed: a positive "
                             "integer")
    hf_json, attention, recomputed = model_shape(model, hf)
    return dict(hf_config_json=hf_json, attn_implementation=attention, seq=seq,
                micro_batch=micro_batch,
                activation_checkpointing=bool(recomputed if activation_checkpointing is None
                                              else activation_checkpointing))


def _bytes(value, what):
    """Sizes as the CLI takes them ("80GB" = 80e9, "80GiB" = 80 x 2^30) or numbers."""
    if not value:
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    return _zeroshard.parse_bytes(str(value), what)
