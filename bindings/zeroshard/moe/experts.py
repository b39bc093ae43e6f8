"""deepspeed.moe.experts: the experts' container."""
from .._experts.expert_parallel import Experts  # noqa: F401
