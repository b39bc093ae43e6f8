"""zeroshard.accelerator.get_accelerator(): DeepSpeed's accelerator object for the device
this process trains on (a GPU where torch sees one, else the CPU), so that scripts written
against `deepspeed.accelerator.get_accelerator()` run unchanged. Its methods are
DeepSpeed's names over torch.cuda, or their CPU meaning (memory figures from the
process's resident memory, no streams)."""
import resource

import torch

from .. import _zeroshard
from .._common import devices


class _Accelerator:
    """The methods DeepSpeed's CUDA and CPU accelerators share that scripts call; one
    that is not here raises AttributeError naming zeroshard."""

    def __init__(self, name):
        self._name = name
        self._cuda = name == "cuda"

    # --- the device
    def device_name(self, device_index=None):
        return self._name if device_index is None else f"{self._name}:{device_index}"

    def device(self, device_index=None):
        return torch.device(self.device_name(device_index))

    def current_device(self):
        return torch.cuda.current_device() if self._cuda else 0

    def current_device_name(self):
        return self.device_name(self.current_device()) if self._cuda else "cpu"

    def set_device(self, device_index):
        if self._cuda:
            torch.cuda.set_device(device_index)

    def device_count(self):
        return torch.cuda.device_count() if self._cuda else 1

    def is_available(self):
        return torch.cuda.is_available() if self._cuda else True

    def synchronize(self, device_index=None):
        if self._cuda:
            torch.cuda.synchronize(device_index)

    def is_synchronized_device(self):
        return not self._cuda

    def communication_backend_name(self):
        return "nccl" if self._cuda else "gloo"

    def is_bf16_supported(self):
        return torch.cuda.is_bf16_supported() if self._cuda else True

    def is_fp16_supported(self):
        return True

    def supported_dtypes(self):
        return [torch.float, torch.bfloat16, torch.half]

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory() if self._cuda else tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned() if self._cuda else False

    # --- random numbers
    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed) if self._cuda else torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed) if self._cuda else torch.manual_seed(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed() if self._cuda else torch.initial_seed()

    def get_rng_state(self, device_index=None):
        if self._cuda:
            return torch.cuda.get_rng_state(device_index if device_index is not None else "cuda")
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        if self._cuda:
            return torch.cuda.set_rng_state(new_state,
                                            device_index if device_index is not None else "cuda")
        return torch.set_rng_state(new_state)

    def random(self):
        return torch.random

    # --- streams and events (the CPU has none: what runs, runs in order)
    @property
    def Stream(self):
        return torch.cuda.Stream if self._cuda else _refuse("Stream")

    def stream(self, stream):
        return torch.cuda.stream(stream) if self._cuda else _refuse("stream")

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index) if self._cuda else _refuse("current_stream")

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index) if self._cuda else _refuse("default_stream")

    @property
    def Event(self):
        return torch.cuda.Event if self._cuda else _refuse("Event")

    def range_push(self, msg, domain=None, category=None):
        if self._cuda:
            torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain=None):
        if self._cuda:
            torch.cuda.nvtx.range_pop()

    # --- memory (on the CPU: this process's resident memory)
    def empty_cache(self):
        if self._cuda:
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index) if self._cuda else _rss()

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index) if self._cuda else _peak_rss()

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index) if self._cuda else _rss()

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index) if self._cuda else _peak_rss()

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    def reset_peak_memory_stats(self, device_index=None):
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(device_index)

    reset_max_memory_allocated = reset_peak_memory_stats
    reset_max_memory_cached = reset_peak_memory_stats

    def memory_stats(self, device_index=None):
        if self._cuda:
            return torch.cuda.memory_stats(device_index)
        return {"allocated_bytes.all.current": _rss(), "allocated_bytes.all.peak": _peak_rss()}

    def total_memory(self, device_index=None):
        if self._cuda:
            return torch.cuda.get_device_properties(device_index or 0).total_memory
        import os
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index=None):
        if self._cuda:
            return torch.cuda.mem_get_info(device_index)[0]
        import os
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def __repr__(self):
        return f"zeroshard accelerator '{self._name}'"


def _refuse(what):
    raise _zeroshard.Error(f"get_accelerator().{what}: the CPU has no streams or events "
                           "(its work runs in order); call it only where a GPU is")


def _rss():
    with open("/proc/self/statm") as f:
        import os
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_current = None


def get_accelerator():
    """The accelerator of this process: DS_ACCELERATOR's ('cuda' or 'cpu') where it is
    set, else CUDA where torch sees a GPU, else the CPU."""
    global _current
    if _current is None:
        _current = _Accelerator(devices.accelerator_name())
    return _current


def is_current_accelerator_supported():
    return True
