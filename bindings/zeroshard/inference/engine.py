"""zeroshard.init_inference: a model served by the training engine's parts, with no optimizer
and no gradients. Every parameter is frozen, so the engine holds the weights alone: at
stage 3 each rank keeps 1/d of them in the tier offload_param names (the device, host RAM
or NVMe) and gathers each unit into the device just before it runs, as in training.

    engine = zeroshard.init_inference("saved/", config={"zero_optimization": {"stage": 3,
                                      "offload_param": {"device": "nvme",
                                                        "nvme_path": "/local_nvme"}}})
    tokens = engine.generate(input_ids, max_new_tokens=32)

A folder save_pretrained wrote is built on the meta device from its config.json and each
weight read from its safetensors file just before the engine stores it (one unit at a
time: the model is never whole in RAM). Without a launcher's environment it runs as one
process; under torchrun (or `zeroshard`) every rank generates its own prompts, kept in step
at stage 3."""
import contextlib
import copy
import json
import os
import socket

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from .._common import config as _config, launch as _launch
from .. import _zeroshard
from .._engine.construction import SafetensorsFile
from .._engine.engine import ZeroShardEngine

DEFAULT_CONFIG = {"zero_optimization": {"stage": 3}}
_SINGLE_FILE, _INDEX = "model.safetensors", "model.safetensors.index.json"


def _error(message):
    return _zeroshard.Error(f"zeroshard.init_inference: {message}")


def _one_process_env():
    """Plain `python script.py`: a world of one, at a free local port."""
    if any(v in os.environ for v in _launch.LAUNCH_VARS):
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def inference_config(config, dtype):
    """The engine's config for serving: DeepSpeed's keys; no optimizer, scheduler or
    gradient settings (refused by name); bf16/fp16 from the weights' dtype (so the weights
    are stored and computed in it); parameters offloaded alone (the optimizer offload the
    engine's combinations ask for names the same tier: it holds nothing)."""
    config, origin = _config.as_mapping(copy.deepcopy(DEFAULT_CONFIG) if config is None else config)
    for key, half in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        _config.fill(config, f"{key}.enabled", dtype == half, f"the weights' dtype ({dtype})",
                     origin)
    for key in ("optimizer", "scheduler"):
        if key in config:
            raise _error(f"{origin}: the '{key}' section has no use in inference; remove it")
    zero = config.setdefault("zero_optimization", {})
    zero.setdefault("stage", 3)
    # The planner's inference rule (two units ahead), not training's 5e7 elements, which
    # gathers a whole model of that size at once.
    zero.setdefault("stage3_prefetch_bucket_size", "auto")
    param = zero.get("offload_param") or {}
    if param.get("device", "none") != "none":  # the parser refuses it below stage 3
        mirrored = {k: v for k, v in param.items() if k in ("device", "nvme_path", "pin_memory")}
        zero.setdefault("offload_optimizer", mirrored)
    config.setdefault("train_micro_batch_size_per_gpu", 1)
    return config


@contextlib.contextmanager
def _parameters_on_meta():
    """Modules built here get meta parameters (no storage); buffers stay real, since they
    are computed in __init__ (rotary frequencies) and not always saved."""
    def to_meta(_module, _name, param):
        if param is not None and not param.is_meta:
            return torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        return None

    handle = register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()


def _weight_files(folder):
    """{checkpoint key: safetensors file} of a folder save_pretrained wrote."""
    index = os.path.join(folder, _INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {k: os.path.join(folder, v) for k, v in weight_map.items()}
    single = os.path.join(folder, _SINGLE_FILE)
    if not os.path.isfile(single):
        raise _error(f"'{folder}' has neither {_SINGLE_FILE} nor {_INDEX} (allowed: a folder "
                     "save_pretrained wrote with safetensors, or a torch.nn.Module)")
    return {k: single for k in SafetensorsFile(single).keys()}


def _model_from_folder(folder, dtype):
    """(the model built on meta from config.json, {id(parameter): (file, key)})."""
    files = _weight_files(folder)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise _error(f"'{folder}' has no config.json (the model's architecture, which "
                     "save_pretrained writes)")
    import transformers
    config = transformers.AutoConfig.from_pretrained(folder)
    dtype = dtype or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    with _parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    names = {}  # every name of each parameter (tied ones have several)
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), (p, []))[1].append(name)
    sources = {}
    for key, (p, aliases) in names.items():
        found = [n for n in aliases if n in files]
        if not found:
            raise _error(f"'{folder}': no weight for '{aliases[0]}' in its safetensors files "
                         f"(the model built from config.json, {type(model).__name__}, has it)")
        sources[key] = (files[found[0]], found[0])
    return model, sources


class InferenceEngine:
    """The served model: call it as the model (engine(input_ids=...)), generate() as its
    own, module the model itself; memory_report() as the training engine's."""

    def __init__(self, engine):
        self.engine = engine
        self.module = engine.module
        self.module.eval()

    def __call__(self, *args, **kwargs):
        with torch.no_grad():
            return self.engine(*args, **kwargs)

    forward = __call__

    def eval(self):  # DeepSpeed's InferenceEngine is a module: scripts call engine.eval()
        self.module.eval()
        return self

    def generate(self, *args, **kwargs):
        self._place_kv_cache(args, kwargs)
        with torch.no_grad():
            return self.module.generate(*args, **kwargs)

    def _place_kv_cache(self, args, kwargs):
        """On a GPU, a KV cache that would not fit in the device's free memory stays in host
        RAM: transformers' offloaded cache moves each layer's to the device for its turn
        (docs/memory-model.md "Inference"). A cache the caller chose is theirs."""
        device = self.engine.device
        if (device.type != "cuda" or "cache_implementation" in kwargs
                or kwargs.get("past_key_values") is not None):
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        config = kwargs.get("generation_config") or getattr(self.module, "generation_config", None)
        if (not isinstance(ids, torch.Tensor) or ids.dim() != 2 or config is None
                or getattr(config, "cache_implementation", None) is not None):
            return  # the model's or the caller's generation config chose its cache
        new = kwargs.get("max_new_tokens", config.max_new_tokens)
        tokens = ids.shape[1] + new if new is not None else kwargs.get("max_length", config.max_length)
        # Beams and returned sequences each keep a cache of their own.
        copies = max(kwargs.get("num_beams", config.num_beams) or 1,
                     kwargs.get("num_return_sequences", config.num_return_sequences) or 1)
        try:
            need = kv_cache_bytes(self.module, ids.shape[0] * copies, tokens)
        except AttributeError:  # no transformers config to count it from
            return
        free = torch.cuda.mem_get_info(device)[0] + (torch.cuda.memory_reserved(device)
                                                     - torch.cuda.memory_allocated(device))
        if need > 0.9 * free:
            kwargs["cache_implementation"] = "offloaded"
            if self.engine.rank == 0:
                print(f"zeroshard: generate: the KV cache of {ids.shape[0] * copies} x {tokens} tokens "
                      f"({need / 2**30:.2f} GiB) does not fit in the device's free "
                      f"{free / 2**30:.2f} GiB: kept in host RAM (cache_implementation="
                      "'offloaded'), each layer's moved to the device for its turn", flush=True)

    def memory_report(self):
        return self.engine.memory_report()

    @property
    def plan(self):
        return self.engine.plan


def kv_cache_bytes(model, batch, tokens):
    """The KV cache generate keeps for `batch` sequences of `tokens`: every layer's keys and
    values, kv heads x head size each, in the model's dtype (plan/MemoryModel.cpp's count)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * batch * tokens * kv_heads * head_dim * element


def init_inference(model, config=None, dtype=None):
    """model: a torch.nn.Module, or a folder save_pretrained wrote (safetensors, one file
    or shards; needs transformers). config: a path or a dict, DeepSpeed's keys (default:
    stage 3, weights on the device). dtype: the folder's model's parameters (default: its
    config's torch_dtype)."""
    _one_process_env()
    sources = None
    if isinstance(model, (str, os.PathLike)):
        folder = os.fspath(model)
        if not os.path.isdir(folder):
            raise _error(f"'{folder}' is not a folder; allowed: a torch.nn.Module or a folder "
                         "save_pretrained wrote")
        model, sources = _model_from_folder(folder, dtype)
    elif not isinstance(model, torch.nn.Module):
        raise _error(f"model: a {type(model).__name__}; allowed: a torch.nn.Module or a folder")
    elif dtype is not None:
        raise _error("dtype is for a folder's model; convert a module with module.to(dtype)")
    floating = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(floating) > 1:
        raise _error(f"the model's parameters are in {sorted(map(str, floating))}; allowed: one "
                     "floating-point dtype (module.to(dtype))")
    for p in model.parameters():
        p.requires_grad_(False)
    config = inference_config(config, floating.pop() if floating else torch.float32)
    engine = ZeroShardEngine(model, config, weight_sources=sources)
    return InferenceEngine(engine)
