"""deepspeed.moe.sharded_moe: the gate, the layer's parts and the gating functions."""
from .._experts.expert_parallel import MOELayer, TopKGate  # noqa: F401
from .._experts.moe_gating import (gumbel_rsample, multiplicative_jitter,  # noqa: F401
                                    top1gating, top2gating, topkgating)
