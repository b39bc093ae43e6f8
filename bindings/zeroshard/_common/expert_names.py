"""How DeepSpeed's MoE layer names its experts' parameters, and their numbers in the whole
layer. A rank of an expert-parallel group of N holds L = E / N of a layer's E experts as
deepspeed_experts.0 .. L-1; the rank at place p of the group holds experts p x L .. p x L +
L - 1 of the whole layer, the numbers DeepSpeed's expert checkpoint files use and under
which zeroshard's checkpoints and state_dict keep them (so they load at any ep size)."""
import re

# A key of a DeepSpeed layer's experts: (the layer's prefix, local expert, rest of the key).
NUMBERED = re.compile(r"^(.*deepspeed_moe\.experts\.deepspeed_experts\.)(\d+)\.(.*)$")


def whole_name(prefix, place, local, index, rest):
    """Local expert `index` of the rank at `place` in its expert-parallel group (`local`
    experts a rank), under its number in the whole layer."""
    return f"{prefix}{place * local + index}.{rest}"
