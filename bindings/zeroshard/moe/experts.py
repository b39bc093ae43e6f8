"""deepspeed.moe.experts: the experts' container."""
from .._parallel.expert_parallel import Experts  # noqa: F401
