"""Experts in DeepSpeed's checkpoints, as the converter (deepspeed_checkpoint.py) reads them:
DeepSpeed's MoE layer's and AutoEP's (deepspeed_autoep.py) at ZeRO 1-2 (GroupLayouts),
AutoEP's at ZeRO 3 (Stage3Layouts; DeepSpeed refuses its MoE layer there).

At ZeRO 1-2 experts are parameter groups of their own
(`moe` in the optimizer's param_groups), each cut per expert-parallel coordinate into one
partition per rank of that coordinate's expert-data-parallel group: `partition_count` of
them, not one per rank. param_shapes (rank 0's) names rank 0's own experts,
deepspeed_experts.0 .. L-1. In DeepSpeed's layout (consecutive ranks split the experts) rank
r holds coordinate c = r % ep, partition r // ep, and its local expert i is expert c x L + i
of the whole layer: the converted checkpoint keeps every coordinate's experts under those
numbers (_common/expert_names.py), so it loads at any ep size.

(DeepSpeed's per-expert files, layer_L_expert_E_mp_rank_XX_model_states.pt, hold the
experts' module weights; the fp32 masters and the optimizer's state come from the ZeRO
files, as for every other parameter.)"""
import math

from .._common.expert_names import NUMBERED, whole_name
from .deepspeed_autoep import AutoEpNames
from .deepspeed_files import error


class _Renaming:
    """What both layouts share: AutoEP's parameters and buffers under the model's names."""
    autoep = None

    def rename(self, name):
        """The model's name of DeepSpeed's parameter or buffer `name` (not an expert)."""
        return self.autoep.rename(name) if self.autoep else name

    def write(self, out, place, name, begin, columns):
        """Elements [begin, begin + n) of parameter `name` as the coordinate at `place`
        holds it (columns: each array's n values) into `out`."""
        if self.autoep:
            self.autoep.write(out, place, name, begin, columns)
        else:
            out.trained(name, begin, columns)

    def check_frozen(self, frozen):
        for name in frozen:
            if self.autoep and (name in self.autoep.experts or self.rename(name) != name):
                raise error(f"frozen '{name}' of an AutoEP layer: not converted; allowed: "
                            "AutoEP layers whose parameters all train")


class GroupLayouts(_Renaming):
    """Each stage 1-2 parameter group's coordinates: one for a dense group (every rank a
    partition of it); ep for an expert group, each with its parameters under their numbers
    in the whole layer and its partitions on the ranks r with r % ep == c."""

    def __init__(self, model_state, optim, world):
        groups = optim["base_optimizer_state"]["param_groups"]
        config = model_state.get("ds_config") or {}
        if any(g.get("moe") for g in groups) and config.get("use_data_before_expert_parallelism"):
            raise error("saved with use_data_before_expert_parallelism true (expert-parallel "
                        "groups of ranks that lie apart): not converted; allowed: DeepSpeed's "
                        "default layout, consecutive ranks splitting the experts")
        # AutoEP's experts (deepspeed_autoep.py) carry the same names on every coordinate.
        self.autoep = AutoEpNames(model_state, model_state["param_shapes"]) \
            if model_state.get("ds_autoep_layers") else None
        counts = optim.get("partition_count") or [world] * len(groups)
        self.ep, self.shapes = [], []
        for g, shapes in enumerate(model_state["param_shapes"]):
            count = int(counts[g])
            if not groups[g].get("moe"):
                if count != world:
                    raise error(f"group {g} is cut into {count} partitions on {world} ranks; "
                                "allowed: one a rank (or an expert group, moe true)")
                self.ep.append(1)
                self.shapes.append([dict(shapes)])
                continue
            if count < 1 or world % count:
                raise error(f"expert group {g} is cut into {count} partitions on {world} "
                            "ranks; allowed: a divisor of the ranks")
            ep = world // count
            self.ep.append(ep)
            self.shapes.append([dict(shapes) if self.autoep else _numbered(shapes, c, g)
                                for c in range(ep)])

    def coordinate(self, g, rank):
        return rank % self.ep[g]

    def trainable(self):
        """{name: shape} of every trainable parameter, every coordinate's experts."""
        shapes = {n: s for group in self.shapes for shapes in group for n, s in shapes.items()}
        return self.autoep.trainable(shapes) if self.autoep else shapes


def _numbered(shapes, place, g):
    """`shapes` (rank 0's local experts) as the rank at `place` holds them, numbered in the
    whole layer."""
    local = {}  # a layer's prefix: its local expert count
    for name in shapes:
        hit = NUMBERED.match(name)
        if hit is None:
            raise error(f"expert group {g} holds '{name}', which is no expert of "
                        "DeepSpeed's MoE layer (…deepspeed_moe.experts.deepspeed_experts.N.…)")
        local[hit.group(1)] = max(local.get(hit.group(1), 0), int(hit.group(2)) + 1)
    out = {}
    for name, shape in shapes.items():
        prefix, index, rest = NUMBERED.match(name).groups()
        out[whole_name(prefix, place, local[prefix], int(index), rest)] = shape
    return out


class Stage3Layouts(_Renaming):
    """Each stage 3 parameter group's cut: a dense group's parameters in ceil(numel /
    world) pieces, rank r holding piece r; AutoEP's expert groups (deepspeed_autoep.py)
    over the ranks of one ep coordinate, rank r holding coordinate r % ep, piece r // ep
    of ceil(numel / (world / ep)) (DeepSpeed's partitioned expert state; each rank's
    ds_zero_partition_groups says so and is checked)."""

    def __init__(self, model_state, world):
        self.world, self.ep, self.autoep = world, 1, None
        self.shapes = model_state["param_shapes"]
        layers = model_state.get("ds_autoep_layers")
        if layers:
            sizes = {int(layer["ep_size"]) for layer in layers}
            self.ep = sizes.pop() if len(sizes) == 1 else 0
            if self.ep < 1 or world % self.ep:
                raise error(f"AutoEP layers of ep sizes {[layer['ep_size'] for layer in layers]} "
                            f"on {world} ranks; allowed: one ep size dividing the ranks")
            self.autoep = AutoEpNames(model_state, self.shapes)
        # An expert group holds AutoEP's experts alone (param_shapes per parameter group).
        self.experts = []
        for g, shapes in enumerate(self.shapes):
            held = [n in self.autoep.experts for n in shapes] if self.autoep else [False]
            if any(held) and not all(held):
                raise error(f"group {g} holds AutoEP's experts beside other parameters; "
                            "allowed: the experts in a group of their own")
            self.experts.append(bool(held) and all(held))

    def piece(self, g, rank):
        """(coordinate, piece index, pieces) of group g on `rank`."""
        return self._cut(self.experts[g], rank)

    def _cut(self, expert, rank):
        if not expert:
            return 0, rank, self.world
        return rank % self.ep, rank // self.ep, self.world // self.ep

    def check(self, optim, rank):
        """The rank's own account of its pieces (ds_zero_partition_groups), where it has one."""
        for sub in optim.get("ds_zero_partition_groups") or []:
            _, index, count = self._cut("autoep_expert" in (sub.get("families") or []), rank)
            if (int(sub["partition_count"]), int(sub["partition_rank"])) != (count, index):
                raise error(f"rank {rank}: sub-group {sub.get('sub_group')} is piece "
                            f"{sub['partition_rank']} of {sub['partition_count']}; allowed: "
                            f"{index} of {count} (DeepSpeed's default layout)")

    def needed(self):
        """Elements of each rank's fp32_flat_groups the parameters take."""
        return sum(math.ceil(math.prod(s) / self.piece(g, 0)[2])
                   for g, shapes in enumerate(self.shapes) for s in shapes.values())

    def trainable(self):
        """{name: shape} of every trainable parameter."""
        shapes = {n: s for group in self.shapes for n, s in group.items()}
        return self.autoep.trainable(shapes) if self.autoep else shapes

