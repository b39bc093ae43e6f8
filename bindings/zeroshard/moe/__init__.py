"""zeroshard.moe: deepspeed.moe's modules as scripts import them: layer (MoE), utils (the
optimizer's parameter groups with the experts apart), sharded_moe (the gate and the
layer's parts), experts. Every rank holds every expert (ep_size 1); see
zeroshard/_experts/expert_parallel.py."""
from . import experts, layer, sharded_moe, utils  # noqa: F401
