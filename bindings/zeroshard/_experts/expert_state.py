"""The whole model's state_dict where expert parallelism split the experts: each rank of an
expert-parallel group holds its own E / N of them, and the whole model is what one
process holding all E would have (ep_size 1), so it loads into such a model and into
from_pretrained (which AutoEP splits again at any autoep_size).

- DeepSpeed's layer (expert_parallel.py): rank p of the group holds experts
  p * L .. p * L + L - 1 as deepspeed_experts.0 .. L-1 (L = E / N); here they come back
  under their numbers in the whole layer, deepspeed_experts.0 .. E-1, as DeepSpeed numbers
  them in its expert checkpoint files.
- Hugging Face's fused experts (hf_expert_parallel.py) and DTensor experts on a mesh's ep
  dimension (dtensor_experts.py): rank p holds the slices [p * L, p * L + L) of each split
  weight (gate_up_proj and down_proj; the DTensors'); here they are joined along dim 0.

A collective over each expert-parallel group: every rank calls it, with its state_dict's
keys in the model's order (the same on every rank)."""
import torch
import torch.distributed as dist

from .._common.expert_names import NUMBERED as _NUMBERED, whole_name as _whole_name
from .expert_parallel import MoE


def _split_layers(model):
    """({key prefix of a DeepSpeed layer's experts: (group, ep size, local expert count)},
    {key of a fused experts weight: (group, ep size)})."""
    numbered, fused = {}, {}
    for name, module in model.named_modules():
        dot = name + "." if name else ""
        if isinstance(module, MoE) and module.ep_size > 1:
            numbered[f"{dot}deepspeed_moe.experts.deepspeed_experts."] = (
                module.deepspeed_moe.ep_group, module.ep_size, module.num_local_experts)
        split = getattr(module, "zeroshard_expert_parallel", None)
        if split is not None:  # (group, ep size, first expert, the split parameters)
            for attr in split[3]:
                fused[dot + attr] = split[:2]
    return numbered, fused


def saved_names(model, names):
    """What checkpoints keep the split experts among `names` as, so one loads at any ep size
    (engine/Checkpointer.h ExpertNames): ({name: [its name in the whole layer on each place
    of its expert-parallel group]} for DeepSpeed-layer experts, [the fused experts' names],
    whose places hold rows of the whole and are saved as its parts)."""
    numbered, fused = _split_layers(model)
    renamed = {}
    for name in names:
        hit = _NUMBERED.match(name)
        if hit and hit.group(1) in numbered:
            _, size, local = numbered[hit.group(1)]
            renamed[name] = [_whole_name(hit.group(1), place, local, int(hit.group(2)),
                                         hit.group(3)) for place in range(size)]
    return renamed, [name for name in names if name in fused]


def _gathered(tensor, group, size):
    """Every rank's `tensor` of the group, in the group's rank order (its places)."""
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def whole_state(model, state):
    """`state` (this rank's keys and whole tensors) with every rank's experts in it; the
    same dict where no expert is split."""
    numbered, fused = _split_layers(model)
    if not numbered and not fused:
        return state
    hits = {key: hit for key, hit in ((k, _NUMBERED.match(k)) for k in state)
            if hit and hit.group(1) in numbered}
    blocks = {}  # a numbered layer's prefix: [(local expert, rest of the key, tensor)]
    for key, hit in hits.items():
        blocks.setdefault(hit.group(1), []).append((int(hit.group(2)), hit.group(3), state[key]))
    out, done = {}, set()
    for key, value in state.items():
        if key in hits:
            prefix = hits[key].group(1)
            if prefix in done:  # the layer's experts went out at its first key
                continue
            done.add(prefix)
            group, size, local = numbered[prefix]
            entries = [(i, rest, _gathered(t, group, size)) for i, rest, t in blocks[prefix]]
            for place in range(size):
                for i, rest, parts in entries:  # local expert i of that rank, key by key
                    out[_whole_name(prefix, place, local, i, rest)] = parts[place]
        elif key in fused:
            out[key] = torch.cat(_gathered(value, *fused[key]), dim=0)
        else:
            out[key] = value
    return out
