"""deepspeed.moe.layer: the MoE layer."""
from .._experts.expert_parallel import MoE  # noqa: F401
