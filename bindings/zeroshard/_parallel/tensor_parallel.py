"""Tensor parallelism a model brings with it, as DeepSpeed takes it: a Megatron `mpu` (the
object with get_{tensor_,}model_parallel_{rank,world_size,group} and
get_data_parallel_{rank,world_size,group}) and parameters marked
`tensor_model_parallel=True` (Megatron's attribute; `partition_dim` says along which
dimension). The user's own layers run their tensor-parallel collectives; ZeRO shards every
parameter's local slice over the data-parallel ranks (engine/ParallelDims.h), and the
gradient norm counts the parameters every tp rank holds whole once."""
import torch

from .. import _zeroshard
from .._common import process_groups
from .._common.nested import tensors


def _error(message):
    return _zeroshard.Error(f"zeroshard.initialize: {message}")


def _ask(mpu, *names):
    """The first of mpu's methods that exists, called; None where it has none of them."""
    for name in names:
        method = getattr(mpu, name, None)
        if callable(method):
            return method()
    return None


def _size_and_rank(mpu):
    size = _ask(mpu, "get_tensor_model_parallel_world_size", "get_model_parallel_world_size")
    rank = _ask(mpu, "get_tensor_model_parallel_rank", "get_model_parallel_rank")
    if size is None or rank is None:
        raise _error(
            f"mpu: a {type(mpu).__name__} without get_tensor_model_parallel_world_size/_rank "
            "(or get_model_parallel_world_size/_rank); allowed: Megatron's mpu, or an object "
            "with those methods")
    return int(size), int(rank)


def stages_of(mpu):
    """The mpu's pipeline-parallel size (0 without an mpu: the config's pipeline.stages)."""
    if mpu is None:
        return 0
    return int(_ask(mpu, "get_pipeline_model_parallel_world_size") or 1)


def plan_of(mpu, named_params):
    """(tp size, {name: partition_dim} of the parameters split across the tp ranks) for `mpu`
    (None: (0, {}), the config decides), checked against the layout the engine uses: tp ranks consecutive
    (Megatron's default order), the data-parallel ranks the others."""
    if mpu is None:
        return 0, {}
    size = check_layout(mpu)
    split = {name: int(getattr(p, "partition_dim", 0)) for name, p in named_params
             if getattr(p, "tensor_model_parallel", False)}
    if size > 1 and not split:
        raise _error(
            f"mpu: tensor-parallel size {size}, but no parameter has tensor_model_parallel=True; "
            "allowed: mark each split parameter as Megatron's layers do (every unmarked one is "
            "taken as held whole by every tensor-parallel rank), or split the model by its "
            "tp_plan with the config's tensor_parallel.autotp_size")
    return size, split


def check_autotp_mpu(mpu, autotp_size):
    """AutoTP (the config's tensor_parallel.autotp_size) with a script's mpu, as DeepSpeed's
    examples pass both: the model is split by its tp_plan over the engine's groups, so the
    mpu's must be those (its sizes and this rank's place in them)."""
    stages = stages_of(mpu)
    if stages > 1:
        raise _error(f"mpu: pipeline-parallel size {stages} with tensor_parallel.autotp_size "
                     f"{autotp_size}: a model's own tp_plan is laid over every rank, not over "
                     "one stage's; allowed: an mpu without pipeline stages")
    size = check_layout(mpu)
    if size != autotp_size:
        raise _error(f"mpu: tensor-parallel size {size}, but the config's "
                     f"tensor_parallel.autotp_size is {autotp_size}; allowed: the same size")


def check_layout(mpu):
    """The mpu's tensor-parallel size, its groups checked to be the ones the engine lays out:
    tp ranks consecutive (Megatron's default order), the data-parallel ranks the others,
    pipeline stages outermost."""
    size, tp_rank = _size_and_rank(mpu)
    env = _zeroshard.launch_env()
    rank, world, stages = env["rank"], env["world_size"], stages_of(mpu)
    if stages < 1 or world % stages != 0:
        raise _error(f"mpu: pipeline-parallel size {stages} does not divide the {world} ranks")
    per_stage = world // stages  # pipeline stages outermost, as Megatron orders them
    if size < 1 or per_stage % size != 0:
        raise _error(f"mpu: tensor-parallel size {size} does not divide the {per_stage} ranks"
                     + (" of a pipeline stage" if stages > 1 else ""))
    dp_size = _ask(mpu, "get_data_parallel_world_size")
    dp_rank = _ask(mpu, "get_data_parallel_rank")
    stage = _ask(mpu, "get_pipeline_model_parallel_rank")
    local = rank % per_stage
    expected = (rank % size, per_stage // size, local // size, rank // per_stage)
    found = (tp_rank, per_stage // size if dp_size is None else int(dp_size),
             local // size if dp_rank is None else int(dp_rank),
             rank // per_stage if stage is None else int(stage))
    if found != expected:
        raise _error(
            f"mpu: rank {rank} of {world} is tensor-parallel rank {found[0]} of {size}, "
            f"data-parallel rank {found[2]} of {found[1]} and in pipeline stage {found[3]}; "
            f"zeroshard lays ranks out as Megatron's default order does (consecutive ranks "
            f"share a tensor-parallel group, pipeline stages outermost): allowed: "
            f"tensor-parallel rank {expected[0]}, data-parallel rank {expected[2]} of "
            f"{expected[1]}, stage {expected[3]}")
    return size


def check_optimizer(size, optimizer_name):
    """Optimizers whose statistics span a whole parameter would see this rank's slice."""
    if size > 1 and optimizer_name == "Adafactor":
        raise _error(
            f"optimizer: Adafactor with tensor-parallel size {size}; allowed: an elementwise "
            "optimizer (AdamW, Adam, SGD, ...): Adafactor's row and column statistics would be "
            "of this rank's slices, not of the parameters")


def _bits(t):
    """`t`'s elements as int64 holding their bits, so sums compare exactly."""
    t = t.detach().reshape(-1).contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.int64)
    if t.is_floating_point() or t.is_complex():
        t = t.view(torch.uint8) if t.element_size() not in (2, 4, 8) else t.view(
            {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t.to(torch.int64)


def fingerprint(inputs):
    """Four int64s that differ, but for a hash collision, where two ranks' input tensors do:
    how many, their sizes, and their elements' bits summed plainly and by position."""
    out = None
    for i, t in enumerate(inputs, start=1):
        x = _bits(t)
        position = torch.arange(1, x.numel() + 1, dtype=torch.int64, device=x.device)
        row = torch.stack([torch.ones((), dtype=torch.int64, device=x.device),
                           torch.tensor(x.numel() * i + 7 * t.dim(), device=x.device),
                           x.sum() * i, (x * position).sum()])
        out = row if out is None else out + row.to(out.device)
    return out


class SameInputs:
    """Every rank of a tensor-parallel group computes on the same batch, or the split layers
    mix rows of different samples and nothing fails. Each training forward's tensor inputs
    are compared across the group (their fingerprints all-gathered: one collective of four
    int64s); where they differ every rank of the group raises, naming the ranks."""

    def __init__(self, tp):
        import torch.distributed as dist
        self.dist, self.tp = dist, tp
        rank, world = dist.get_rank(), dist.get_world_size()
        self.first = rank - rank % tp
        self.group = None
        for start in range(0, world, tp):  # every rank makes every group, in one order
            group = process_groups.new_group(list(range(start, start + tp)))
            if start == self.first:
                self.group = group
        # Fingerprints travel on the group's device: NCCL's, the current GPU.
        nccl = dist.get_backend(self.group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else \
            torch.device("cpu")
        self.forwards = 0

    def check(self, args, kwargs):
        self.forwards += 1
        mine = fingerprint(list(tensors((args, kwargs))))
        # Zeros for a forward without tensor inputs, so every rank takes part in the gather.
        mine = torch.zeros(4, dtype=torch.int64) if mine is None else mine
        mine = mine.to(self.device)
        everyone = [torch.empty_like(mine) for _ in range(self.tp)]
        self.dist.all_gather(everyone, mine, group=self.group)
        differ = [self.first + t for t in range(self.tp) if not torch.equal(everyone[t], everyone[0])]
        if differ:
            raise _zeroshard.Error(
                f"zeroshard: training forward {self.forwards}: the inputs of rank(s) "
                f"{', '.join(map(str, differ))} differ from rank {self.first}'s, in one "
                f"tensor-parallel group (ranks {self.first} to {self.first + self.tp - 1}); "
                "every rank of a tensor-parallel group must compute on the same batch: split "
                "the data over the data-parallel ranks alone (engine.data_parallel_rank of "
                "engine.dp_world_size, or the mpu's get_data_parallel_rank()), as Megatron's and "
                "DeepSpeed's loaders do")


def join_slices(full, split, peers):
    """Each split parameter of `full` ({name: this rank's tensor}) replaced by the whole one:
    its tp group's slices (all-gathered over `peers`, a SameInputs) joined along the
    dimension it was split on. Every rank calls it, names in one order."""
    for name in sorted(split):
        if name not in full:
            continue
        mine = full[name].contiguous()
        parts = [torch.empty_like(mine) for _ in range(peers.tp)]
        peers.dist.all_gather(parts, mine, group=peers.group)
        full[name] = torch.cat(parts, dim=split[name])
