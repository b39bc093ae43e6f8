"""accelerate's ParallelismConfig(sp_backend='deepspeed', sp_size=N), ALST's path, as the
front-ends take it (Accelerator, ZeroShardTrainer): checked, Ulysses registered with
transformers for the model (the mpu and sequence_parallel_size for the engine), the data
loaders adapted (a rank's draw shared with its group, each holding its slice), and the
loss of each slice weighted by its tokens over the group, as accelerate's and the
Trainer's DeepSpeed paths do it."""
import torch

from .._common import config as _config


def check(parallelism, error):
    """Its DeepSpeed sequence parallelism (sp_size with sp_backend 'deepspeed') is the
    engine's, and so is torch's context parallelism (cp_size with cp_backend 'torch', beside
    dp_shard and dp_replicate, whose ranks the engine shards over as it chooses; see
    _context_parallel.py); every other dimension above 1 is another backend's sharding or
    not composed here yet: error(message) raised naming them."""
    if parallelism is None:
        return
    sizes = {name: getattr(parallelism, f"{name}_size", 1) or 1
             for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp")}
    context = sizes["cp"] > 1 and sizes["sp"] == 1 and sizes["tp"] == 1 and \
        getattr(parallelism, "cp_backend", "torch") == "torch"
    others = {name: size for name, size in sizes.items() if name != "sp" and size > 1}
    if context or not (others or sizes["sp"] == 1):
        return
    given = ", ".join(f"{name}_size={size}" for name, size in sizes.items() if size > 1)
    raise error(
        f"parallelism_config ({given or 'every size 1'}): zeroshard shards over the "
        "data-parallel ranks itself (the rest of the world) and takes DeepSpeed's sequence "
        "parallelism from it; allowed: ParallelismConfig(sp_backend='deepspeed', "
        "sp_size=N), or ParallelismConfig(cp_size=N) (torch's ring attention; dp_shard_size "
        "and dp_replicate_size beside it)")


def size(parallelism):
    """The sequence-parallel size it asks for: 1 without one."""
    return (getattr(parallelism, "sp_size", 1) or 1) if parallelism is not None else 1


def register(parallelism, model, config, origin, error):
    """Ulysses registered with transformers for the model's attention, the config's
    sequence_parallel_size filled in (`origin` names the config in a contradiction); the
    mpu for initialize(mpu=)."""
    from ..runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    if not hasattr(model, "config"):
        raise error(f"parallelism_config sp_size={parallelism.sp_size}: Ulysses goes around a "
                    f"transformers model's attention, and {type(model).__name__} has no "
                    "config; allowed: a transformers model")
    _config.fill(config, "sequence_parallel_size", parallelism.sp_size,
                 "ParallelismConfig(sp_size)", origin)
    handler = parallelism.sp_handler
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation=handler.sp_attn_implementation,
        sequence_parallel_size=parallelism.sp_size,
        micro_batch_size=config.get("train_micro_batch_size_per_gpu", 1),
        seq_length=handler.sp_seq_length,
        seq_length_is_variable=handler.sp_seq_length_is_variable, disable_in_eval=True)


def adapted(parallelism, loader, device):
    """The loader with each rank's draw shared over its sequence-parallel group, each rank
    taking its slice (after register: the group exists); the loader itself without sp."""
    if size(parallelism) <= 1:
        return loader
    from ..runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from ..utils import groups
    return UlyssesSPDataLoaderAdapter(
        loader, sp_rank=groups._get_sequence_parallel_rank(),
        sp_group=groups._get_sequence_parallel_group(),
        sp_world_size=groups._get_sequence_parallel_world_size(), device=device)


def group_loss(loss, shift_labels):
    """This rank's slice's mean loss made the whole sequence's: every slice's mean weighted
    by its target tokens (shift_labels not -100) over the sequence-parallel group, gathered
    so that each rank's gradient flows back to it."""
    from ..utils import groups
    group = groups._get_sequence_parallel_group()
    losses = torch.distributed.nn.functional.all_gather(loss, group=group)
    tokens = (shift_labels != -100).view(-1).sum()
    counts = torch.distributed.nn.functional.all_gather(tokens, group=group)
    total = sum(losses[r] * counts[r] for r in range(len(losses)))
    return total / max(sum(counts), 1)
