"""zeroshard.init: building a model already sharded (DeepSpeed's zero.Init shape).

    with zeroshard.init(config="configs/zero3.yaml"):
        model = MyModel()          # each rank keeps 1/d of every parameter
    engine, *_ = zeroshard.initialize(model=model, config="configs/zero3.yaml")

Design notes.
- When a module's __init__ is over its parameters hold their initial values: that moment
  is when the module is attached to its parent (torch's global module-registration hook
  fires then) or, for the root, when the context ends. Each parameter is then broadcast
  from rank 0 (every rank starts from rank 0's values, as in a plain initialize), this
  rank keeps its 1/d slice, and the parameter's data becomes one NaN spread over its
  shape: shape, dtype and identity stay, a read shows NaN, a write fails in torch. So a
  rank holds its shards plus the module being built, never the whole model.
- Code that runs after a module was sharded and touches its parameters (Hugging Face's
  post_init re-initialises every module; nanoGPT's root __init__ re-initialises every
  matrix) finds them whole: a torch function mode gathers the sharded parameters an
  operation reads or writes, and shards again those gathered for an earlier operation,
  so one operation's parameters are whole at a time. (A tensor taken from one with
  `.data` and written after another parameter was touched would write to a copy that is
  gone: initialise one parameter after the other.) Every rank runs the same
  construction, so every rank gathers the same parameters in the same order; printing a
  sharded parameter shows NaN and gathers nothing.
- initialize() gives the engine a materialize callback: just before it copies a group of
  parameters into its flat buffers it gathers that group (the engine's own groups, one
  unit at a time), so building the engine holds at most one unit whole too.
- A parameter set on a module after its __init__ (from_pretrained builds on the meta
  device, then sets each tensor it loads) is sharded as it is set: a checkpoint is
  loaded tensor by tensor, never whole.
- Parameters made on the meta device (FSDP2's flow, `with torch.device("meta")`) are left
  alone here; initialize() materialises them group by group through the owning
  modules' reset_parameters(). Collectives go through torch.distributed (Gloo), which the
  context initialises when the script has not; the engine later joins its store.
"""
import contextlib
import json
import os
import struct
import sys

import torch
from torch.nn.modules.module import (register_module_module_registration_hook,
                                     register_module_parameter_registration_hook)
from torch.overrides import TorchFunctionMode

from .._common import launch as _launch
from .. import _zeroshard
from .._parallel.param_shards import Sharder, give_back_freed_memory, is_sharded, poison
from .touch import METADATA
from .._common.config import parse

_active = None  # the _Sharder of the innermost open context


def _sharded_args(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else (a,)
        for t in items:
            if isinstance(t, torch.nn.Parameter) and is_sharded(t):
                yield t


class _GatherOnTouch(TorchFunctionMode):
    def __init__(self, sharder):
        super().__init__()
        self.sharder = sharder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.sharder.busy and func not in METADATA:
            params = list(_sharded_args(args, kwargs))
            if params:
                self.sharder.touch(params)
        return func(*args, **kwargs)


def _hf_initialize_weights():
    """Hugging Face's per-module weight initialisation, if transformers is loaded."""
    mu = sys.modules.get("transformers.modeling_utils")
    return getattr(mu, "PreTrainedModel", None) if mu else None


# DeepSpeed's zero.Init keywords zeroshard takes; every other one is refused by name.
_DEEPSPEED_ONLY = ("data_parallel_group", "mem_efficient_linear", "remote_device",
                   "pin_memory", "dtype", "mpu", "zero_param_parallel_group",
                   "zero_quantized_weights", "zero_quantized_nontrainable_weights",
                   "sequence_data_parallel_group", "param_swapper")


class Init:
    """`with zeroshard.init(config=...):` builds modules sharded across the launch's
    ranks (see the module notes). `module=`: shard an already built module now instead.
    `enabled=False`: a plain construction (DeepSpeed's switch)."""

    def __init__(self, module=None, config=None, config_dict_or_path=None, enabled=True,
                 **deepspeed_only):
        for key in deepspeed_only:
            allowed = "module, config, config_dict_or_path, enabled"
            why = ("a DeepSpeed zero.Init option zeroshard does not take"
                   if key in _DEEPSPEED_ONLY else "not a zero.Init option")
            raise _zeroshard.Error(f"zeroshard.init: '{key}' is {why}; allowed: {allowed}")
        if config is not None and config_dict_or_path is not None:
            raise _zeroshard.Error("zeroshard.init: config and config_dict_or_path both given; "
                                   "pass one")
        given = config if config is not None else config_dict_or_path
        if given is not None:
            parse(given)  # a bad config fails now, not after a long construction
        self.enabled = enabled
        self._sharder = None
        if enabled and module is not None:
            with self:
                pass
            for p in module.parameters():
                if not p.is_meta and not is_sharded(p):
                    self._sharder.shard(p)

    def __enter__(self):
        global _active
        if not self.enabled:
            return self
        if _active is not None:
            raise _zeroshard.Error("zeroshard.init: already inside a zeroshard.init context")
        _launch.require_launch_env()
        _launch.init_distributed()
        self._sharder = Sharder()
        self._hooks = [register_module_parameter_registration_hook(self._sharder.on_parameter),
                       register_module_module_registration_hook(self._sharder.on_module)]
        self._mode = _GatherOnTouch(self._sharder)
        self._mode.__enter__()
        self._patch_hf()
        _active = self
        return self

    def _patch_hf(self):
        self._hf = _hf_initialize_weights()
        if self._hf is None:
            return
        original = self._hf._initialize_weights
        sharder = self._sharder

        def initialize_then_reshard(model, module, *args, **kwargs):
            try:
                return original(model, module, *args, **kwargs)
            finally:
                sharder.flush()

        self._hf_original = original
        self._hf._initialize_weights = initialize_then_reshard

    def __exit__(self, *exc):
        global _active
        if not self.enabled:
            return False
        try:
            if self._hf is not None:
                self._hf._initialize_weights = self._hf_original
            for h in self._hooks:
                h.remove()
            self._mode.__exit__(*exc)
            if exc[0] is None:
                self._sharder.finish()
        finally:
            _active = None
        return False


# zeroshard.init is the name scripts use (a context manager, as torch.device is); Init is
# DeepSpeed's spelling (deepspeed.zero.Init).
init = Init


@contextlib.contextmanager
def gathered_shards(params, modifier_rank):
    """Parameters zeroshard.init sharded, whole inside the block (before an engine holds
    them): a collective over torch.distributed. With modifier_rank=R, rank R's values
    when the block ends become every rank's shards; without, what was written is dropped
    (DeepSpeed's GatheredParameters)."""
    sharder = Sharder()
    for p in params:
        sharder.gather(p)
    try:
        yield
    finally:
        for p in params:
            if modifier_rank is not None:
                with sharder.own_operations():
                    sharder.broadcast(p, modifier_rank)
                sharder.reshard(p)
            else:
                sharder.drop(p)


def _owners_of_meta(model):
    """(module, name, parameter) for every parameter on the meta device, once each."""
    seen = set()
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_meta and id(p) not in seen:
                seen.add(id(p))
                yield module, name, p


def materializer_for(model, sources=None, device=None):
    """Before the engine is built: meta parameters become placeholders on the host, or on
    `device` (_engine/placement.py: the GPU the engine trains on), the same objects, so
    optimizer groups keep them, to be made by their module's
    reset_parameters(), or read from a safetensors file where `sources` ({id(parameter):
    (file, key)}) names one. Returns the engine's materialize callback, or None when every
    parameter already holds its values whole (the engine then broadcasts rank 0's)."""
    sources = sources or {}
    if _active is not None:
        raise _zeroshard.Error(
            "zeroshard.initialize was called inside a zeroshard.init context; build the model "
            "under the context and call initialize after its `with` block")
    meta = list(_owners_of_meta(model))
    for module in model.modules():
        _make_meta_buffers(module, device)
    for module, name, p in meta:
        if id(p) not in sources and not callable(getattr(module, "reset_parameters", None)):
            raise _zeroshard.Error(
                f"parameter '{name}' of {type(module).__name__} is on the meta device and "
                f"{type(module).__name__} has no reset_parameters() to make it; give the "
                "module one, or build the model under zeroshard.init instead of "
                "torch.device('meta')")
    if not meta and not any(is_sharded(p) for p in model.parameters()):
        return None
    for module, name, p in meta:
        placeholder = torch.nn.Parameter(poison(p.shape, p.dtype, device),
                                         requires_grad=p.requires_grad)
        torch.utils.swap_tensors(p, placeholder)
        p._zs_home = device
        if id(p) in sources:
            p._zs_source = sources[id(p)]
        else:
            p._zs_owner = module
    _launch.init_distributed()
    return _Materializer()


def _make_meta_buffers(module, device=None):
    """A norm layer's running statistics built on the meta device are made on the host (or
    `device`) by its reset_running_stats() (the engine then gives every rank rank 0's); any other
    buffer on meta has no recipe here and is refused."""
    names = [n for n, b in module._buffers.items() if b is not None and b.is_meta]
    if not names:
        return
    if not callable(getattr(module, "reset_running_stats", None)):
        raise _zeroshard.Error(
            f"buffer '{names[0]}' of {type(module).__name__} is on the meta device: zeroshard "
            "makes parameters from meta (through reset_parameters()) and norm layers' running "
            "statistics (through reset_running_stats()), not other buffers; create buffers on "
            "the host, or call model.to_empty(device='cpu') and initialise the model before "
            "zeroshard.initialize")
    for n in names:
        b = module._buffers[n]
        module._buffers[n] = torch.empty(b.shape, dtype=b.dtype, device=device)
    module.reset_running_stats()


class SafetensorsFile:
    """One tensor at a time from a safetensors file, read into memory of its own (not
    mapped: a mapped file's pages stay in the process's resident set)."""

    DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}

    def __init__(self, path):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        (length,) = struct.unpack("<Q", os.pread(self._fd, 8, 0))
        self._header = json.loads(os.pread(self._fd, length, 8))
        self._data_start = 8 + length

    def keys(self):
        return [k for k in self._header if k != "__metadata__"]

    def read(self, key):
        entry = self._header.get(key)
        if entry is None:
            raise _zeroshard.Error(f"{self.path}: no tensor '{key}'")
        dtype = self.DTYPES.get(entry["dtype"])
        if dtype is None:
            raise _zeroshard.Error(f"{self.path}: '{key}' is {entry['dtype']}; allowed: "
                                   f"{', '.join(self.DTYPES)}")
        begin, end = entry["data_offsets"]
        data = bytearray(end - begin)
        view, done = memoryview(data), 0
        while done < len(data):
            got = os.preadv(self._fd, [view[done:]], self._data_start + begin + done)
            if got <= 0:
                raise _zeroshard.Error(f"{self.path}: ends inside '{key}'")
            done += got
        if not data:
            return torch.empty(entry["shape"], dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


class _Materializer:
    """The engine's materialize callback: each group's parameters whole and equal on every
    rank, just before the engine copies them (a collective, in the engine's group order).
    Sharded parameters are gathered; meta ones made by their module's reset_parameters()
    with its other placeholders, then rank 0's values broadcast, or read by every rank from
    their safetensors file (one tensor at a time, never the whole file); the rest broadcast."""

    def __init__(self):
        self.sharder = Sharder()
        self._files = {}  # path: an open safetensors file

    def __call__(self, params):
        # The previous group's whole values and the shards it replaced are free now.
        give_back_freed_memory()
        # Made on the host; then to the GPU its placeholder was made for (_zs_home:
        # _parallel/placement.py), where the engine builds the group's buffer (the first
        # parameter's device). A module's reset_parameters() makes its others too.
        where = [getattr(p, "_zs_home", None) or p.device for p in params]
        with torch.no_grad():
            for p in params:
                if is_sharded(p):
                    self.sharder.gather(p)
                    p._zs_shard = None
                elif getattr(p, "_zs_owner", None) is not None:
                    self._reset(p._zs_owner)
                elif getattr(p, "_zs_source", None) is not None:
                    self._read(p)
                else:
                    self._broadcast(p)
            for p, device in zip(params, where):
                if p.device != device:
                    p.data = p.data.to(device)

    def _broadcast(self, p):
        self.sharder.broadcast(p)  # a split expert's from the first rank holding its experts

    def _read(self, p):
        path, key = p._zs_source
        if path not in self._files:
            self._files[path] = SafetensorsFile(path)
        tensor = self._files[path].read(key)
        if tuple(tensor.shape) != tuple(p.shape):
            raise _zeroshard.Error(f"{path}: '{key}' has shape {tuple(tensor.shape)}; the model's "
                                   f"parameter has {tuple(p.shape)}")
        p.data = tensor.to(p.dtype)
        p._zs_source = None

    def _reset(self, module):
        made = [p for p in module._parameters.values()
                if p is not None and getattr(p, "_zs_owner", None) is module]
        for p in made:
            p.data = torch.empty(p.shape, dtype=p.dtype)
        module.reset_parameters()
        for p in made:
            p._zs_owner = None
            self._broadcast(p)
