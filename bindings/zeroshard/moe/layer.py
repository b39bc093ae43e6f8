"""deepspeed.moe.layer: the MoE layer."""
from .._parallel.expert_parallel import MoE  # noqa: F401
