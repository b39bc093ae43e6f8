"""zeroshard.estimate: what fits where for a real model, before launch, from the same
Planner as the zeroshard-estimate CLI."""
import os

from . import _zeroshard
from ._config import load_config
from ._units import stage3_units


def _count(params):
    seen, total = set(), 0
    for p in params:
        if id(p) not in seen:  # shared (tied) parameters once
            seen.add(id(p))
            total += p.numel()
    return total


def estimate(model, config=None, nodes=1, gpus_per_node=1, gpu_memory="80GB",
             host_memory=None, nvme=None, units=None):
    """Returns the plan as a dict: summary, recommended option, per-option bytes per rank
    per tier, and the resolved config YAML."""
    unit_counts = [_count(p for _, p in ps) for _, ps in stage3_units(model, units)]
    total = _count(model.parameters())
    text = load_config(config)[0] if config is not None else "{}"
    host = host_memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return _zeroshard.plan(total, unit_counts, max(unit_counts or [total]), text, nodes,
                           gpus_per_node, _bytes(gpu_memory, "gpu_memory"),
                           _bytes(host, "host_memory"), _bytes(nvme, "nvme"))


def _bytes(value, what):
    """Sizes as the CLI takes them ("80GB" = 80e9, "80GiB" = 80 x 2^30) or numbers."""
    if not value:
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    return _zeroshard.parse_bytes(str(value), what)
