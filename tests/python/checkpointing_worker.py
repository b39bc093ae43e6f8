"""One rank of test_activation_checkpointing.py: a stack of blocks (Linear, GELU, dropout,
one dropout under the model-parallel RNG tracker) whose every block runs through
zeroshard.checkpointing.checkpoint, or not at all (mode plain), on the same input on
every rank; the tracker's dropout is summed over the group, so the activations between
blocks are replicated, as a tensor-parallel group's are. The mpu makes
the whole world one tensor-parallel group. Writes the loss, the gradients, and the bytes
of checkpoints held after forward.

usage: checkpointing_worker.py OUT MODE   (MODE: plain, plain_alone (no mpu), whole, cpu,
       partition, partition_cpu, contiguous, config: the keys given to initialize's config)"""
import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  (all_reduce with its backward)

import zeroshard
from zeroshard import checkpointing

BLOCKS, WIDTH, BATCH = 4, 16, 6


class WorldMpu:
    """Megatron's mpu with every rank in one tensor-parallel group."""

    def get_tensor_model_parallel_rank(self):
        return dist.get_rank()

    def get_tensor_model_parallel_world_size(self):
        return dist.get_world_size()

    def get_tensor_model_parallel_group(self):
        return dist.group.WORLD

    def get_data_parallel_rank(self):
        return 0


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x, scale):
        y = self.drop(torch.nn.functional.gelu(self.linear(x)))
        with checkpointing.get_cuda_rng_tracker().fork():
            z = torch.nn.functional.dropout(y, 0.1)  # differs across tensor-parallel ranks
        # Summed over the group, as a row-parallel layer's output is: the activations
        # between blocks are the same on every rank, as partition_activations assumes.
        z = torch.distributed.nn.functional.all_reduce(z) / dist.get_world_size()
        return x + scale * (y + z), "a non-tensor output"


class Stack(torch.nn.Module):
    def __init__(self, checkpointed):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.checkpointed = checkpointed
        self.held = None

    def forward(self, x):
        for block in self.blocks:
            if self.checkpointed:
                x, said = checkpointing.checkpoint(block, x, scale=0.5)
                assert said == "a non-tensor output"
            else:
                x, _ = block(x, 0.5)
        self.held = checkpointing.held_bytes()
        return x.pow(2).mean()


def main():
    out, mode = sys.argv[1], sys.argv[2]
    zeroshard.init_distributed()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Stack(checkpointed=not mode.startswith("plain"))
    settings = {"whole": {}, "cpu": {"checkpoint_in_cpu": True},
                "partition": {"partition_activations": True},
                "partition_cpu": {"partition_activations": True, "checkpoint_in_cpu": True},
                "contiguous": {"partition_activations": True, "contiguous_checkpointing": True,
                               "num_checkpoints": BLOCKS}}
    result = {}
    if mode == "config":
        config = {"train_micro_batch_size_per_gpu": BATCH, "zero_optimization": {"stage": 0},
                  "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
                  "activation_checkpointing": {"enabled": True, "partition_activations": True,
                                               "cpu_checkpointing": True, "profile": True}}
        engine = zeroshard.initialize(model=model, config=config)[0]
        result["configured"] = checkpointing.is_configured()
    else:  # plain: only the mpu, for the tracker's seeds (plain_alone: none, as config's)
        checkpointing.configure(None if mode == "plain_alone" else WorldMpu(),
                                **settings.get(mode, {}))
    # After configure (which may name the mpu): the default generator gets 1234 on every
    # rank, the tracker's state 1234 + 2718 + the tensor-parallel rank (0 on every rank
    # without an mpu, as in mode config: its rank 0 compares with the others' rank 0).
    checkpointing.model_parallel_cuda_manual_seed(1234)
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(7), requires_grad=True)
    losses = []
    for _ in range(2):
        loss = (engine if mode == "config" else model)(x)
        result.setdefault("held", model.held)
        if mode == "config":
            engine.backward(loss)
        else:
            loss.backward()
        losses.append(loss.item())
    result["after_backward"] = checkpointing.held_bytes()
    result["losses"] = losses
    params = model
    result["grads"] = [] if mode == "config" else [p.grad.flatten().tolist()
                                                   for p in params.parameters()]
    result["input_grad"] = x.grad.flatten().tolist()
    result["rank"] = rank
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
