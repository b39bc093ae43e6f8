"""accelerate's ParallelismConfig(cp_size=N) (cp_backend 'torch') as zeroshard's Accelerator
takes it: accelerate's own device mesh (dp_replicate, dp_shard, cp) is built and given to the
engine (initialize(mesh=): torch's ring attention over its cp dimension, zeroshard's
_sequence/context_parallel.py); accelerate's data loaders give a cp group's ranks the same
batches (they read that mesh), its maybe_context_parallel slices the buffers, and its hooks
drop the attention mask for is_causal, all as under its FSDP2 path.

The loss: accelerate's FSDP2 path averages the gradients over its dp_shard_cp ranks, so each
rank's loss counts 1/(dp x cp); the engine sums a cp group's gradients (each rank's loss being
its share of the group's) and divides by the data-parallel ranks. scaled(loss) divides by cp,
so a script's loss (each rank's own mean, as `outputs.loss` is) trains as it does there."""


def size(parallelism):
    """The cp size it asks for: 1 without one."""
    return (getattr(parallelism, "cp_size", 1) or 1) if parallelism is not None else 1


def set_up(accelerator, parallelism, error):
    """After accelerate's __init__ (which is not given the config: it takes one for FSDP2,
    DeepSpeed or GPUs only): the sizes checked against the world, accelerate's mesh built."""
    if size(parallelism) <= 1:
        return
    world = accelerator.num_processes
    if parallelism.total_size != world:
        raise error(f"parallelism_config: dp_replicate_size x dp_shard_size x cp_size = "
                    f"{parallelism.total_size}, over {world} ranks; allowed: sizes whose "
                    f"product is the world size {world}")
    accelerator.state.device_mesh = parallelism.get_device_mesh(accelerator.device.type)


def prepare(accelerator, model):
    """accelerate's own preparation for context parallelism (the ring's rotation method from
    cp_handler, maybe_context_parallel's context, the attention-mask hooks), and the mesh for
    initialize(mesh=). None without cp."""
    if size(accelerator.parallelism_config) <= 1:
        return None
    accelerator._prepare_cp(model)
    return accelerator.torch_device_mesh


def scaled(loss, parallelism):
    return loss / size(parallelism) if size(parallelism) > 1 else loss
