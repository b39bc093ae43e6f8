#!/usr/bin/env python3
"""One rank of a peer in `zs bench peers` (tools/bench/peers.py starts them): torch DDP,
FSDP1, FSDP2 (fully_shard) and DeepSpeed ZeRO, on the CPU over Gloo, training the GPT
that tools/bench/BenchGpt.cpp builds (same modules in the same order, same seed, same
data generator), so the final losses are comparable with zeroshard's.

`zs bench hosts` (tools/bench/hosts.py) runs HOST_MODES here too, ranks on separate
network-namespace hosts: FSDP2's HSDP (a 2-D mesh, sharded on each host) and zeroshard
through its Python package: stage 3, with shard groups per host (MiCS), and with a
secondary copy per host (ZeRO++ hpZ).

usage: peer_worker.py MODE OUT STEPS BATCH NVME_DIR   (environment as torchrun sets it)
Each rank writes OUT.rankN.json; on a host of its own (an eth0 in its namespace), local
rank 0 adds the bytes its host sent over the link during the timed steps."""
import json
import os
import resource
import statistics
import sys
import time

from bench_gpt import gpt_classes

SHAPE = dict(vocab=2048, dim=256, layers=4, heads=4, seq=128)
WARMUP = 2
LR, WEIGHT_DECAY, CLIP = 1e-3, 0.01, 1.0  # zeroshard's defaults, as BenchSharding uses them

TORCH_MODES = ["ddp", "fsdp_no_shard", "fsdp_shard_grad_op", "fsdp_full_shard", "fsdp2",
               "fsdp2_cpu_offload"]
DEEPSPEED_MODES = {  # mode: zero_optimization
    "deepspeed_z1": {"stage": 1},
    "deepspeed_z2": {"stage": 2},
    "deepspeed_z3": {"stage": 3},
    "deepspeed_z3_offload_cpu": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    "deepspeed_z3_offload_nvme": {"stage": 3, "offload_optimizer": {"device": "nvme"},
                                  "offload_param": {"device": "nvme"}},
}
MODES = TORCH_MODES + list(DEEPSPEED_MODES)
ZEROSHARD_MODES = {  # mode: zero_optimization ("host": the ranks of one host)
    "zeroshard_stage3": {"stage": 3},
    "zeroshard_stage3_mics": {"stage": 3, "mics_shard_size": "host"},
    "zeroshard_stage3_hpz": {"stage": 3, "zero_hpz_partition_size": "host"},
}
HOST_MODES = ["fsdp2", "fsdp2_hsdp"] + list(ZEROSHARD_MODES)
LINK = "/sys/class/net/eth0/statistics/tx_bytes"  # `ip netns exec` shows the namespace's


def wrap_fsdp1(torch, mode, model, block_type):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = {
        "fsdp_no_shard": ShardingStrategy.NO_SHARD,
        "fsdp_shard_grad_op": ShardingStrategy.SHARD_GRAD_OP,
        "fsdp_full_shard": ShardingStrategy.FULL_SHARD,
    }[mode]
    return FSDP(model, sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({block_type}),
                device_id=torch.device("cpu"))


def wrap_fsdp2(torch, mode, model):
    """FSDP2 as its docs show it: each block, then the root (the tied embedding)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    world = torch.distributed.get_world_size()
    if mode == "fsdp2_hsdp":  # replicate across hosts, shard inside each
        per_host = int(os.environ["LOCAL_WORLD_SIZE"])
        mesh = init_device_mesh("cpu", (world // per_host, per_host),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    kwargs = {"mesh": mesh}
    if mode == "fsdp2_cpu_offload":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def torch_trainer(torch, mode, model, Block):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif mode.startswith("fsdp2"):
        model = wrap_fsdp2(torch, mode, model)
    else:
        model = wrap_fsdp1(torch, mode, model, Block)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def backward(loss):
        loss.backward()

    def step():
        if mode.startswith("fsdp_"):
            model.clip_grad_norm_(CLIP)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()

    return model, backward, step


def deepspeed_trainer(torch, mode, model, batch, nvme_dir):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    zero = json.loads(json.dumps(DEEPSPEED_MODES[mode]))
    offload = "offload_optimizer" in zero
    for key in ("offload_optimizer", "offload_param"):
        if zero.get(key, {}).get("device") == "nvme":
            zero[key]["nvme_path"] = nvme_dir
    config = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        # Offloaded: DeepSpeed's own CPU Adam, as its users get it; otherwise torch's AdamW
        # (its fused Adam is a CUDA kernel).
        "optimizer": {"type": "AdamW", "params": dict({"lr": LR, "weight_decay": WEIGHT_DECAY},
                                                      **({} if offload else {"torch_adam": True}))},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    return engine, engine.backward, engine.step


def zeroshard_trainer(mode, model, batch):
    import zeroshard

    zero = dict(ZEROSHARD_MODES[mode])
    for key in ("mics_shard_size", "zero_hpz_partition_size"):
        if zero.get(key) == "host":
            zero[key] = int(os.environ["LOCAL_WORLD_SIZE"])
    config = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
        "zero_optimization": zero,
    }
    engine, _, _, _ = zeroshard.initialize(model=model, config=config)
    # The C++ engine's barrier: zeroshard starts no torch.distributed group of its own.
    return engine, engine.backward, engine.step, engine._engine.barrier


def link_sent():
    """Bytes this host has sent to the others (None where the rank has no host of its own)."""
    if os.environ.get("LOCAL_RANK", "0") != "0" or not os.path.exists(LINK):
        return None
    with open(LINK) as f:
        return int(f.read())


def main():
    mode, out, steps, batch, nvme_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4]), sys.argv[5]
    if mode.startswith("deepspeed"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    Gpt, Block = gpt_classes(torch)
    torch.manual_seed(0)
    model = Gpt(SHAPE)
    barrier = dist.barrier
    if mode.startswith("deepspeed"):
        model, backward, step = deepspeed_trainer(torch, mode, model, batch, nvme_dir)
    elif mode.startswith("zeroshard"):
        model, backward, step, barrier = zeroshard_trainer(mode, model, batch)
    else:
        model, backward, step = torch_trainer(torch, mode, model, Block)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gen = torch.Generator().manual_seed(100 + rank)
    phases = {"forward": [], "backward": [], "step": []}
    totals, loss = [], None
    sent_before = None
    for i in range(WARMUP + steps):
        if i == WARMUP:
            barrier()
            sent_before = link_sent()
        tokens = torch.randint(SHAPE["vocab"], (batch, SHAPE["seq"] + 1), generator=gen)
        t0 = time.perf_counter()
        loss = model(tokens)
        t1 = time.perf_counter()
        backward(loss)
        t2 = time.perf_counter()
        step()
        t3 = time.perf_counter()
        if i >= WARMUP:
            for name, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
                phases[name].append(seconds)
            totals.append(t3 - t0)
    barrier()
    sent = link_sent()
    median = statistics.median(totals)
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({
            "link_sent_bytes_per_step": None if sent is None else (sent - sent_before) / steps,
            "system": mode,
            "median_step_seconds": median,
            "tokens_per_second": batch * SHAPE["seq"] * world / median,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "final_loss": loss.item(),
            "phase_seconds": {k: statistics.median(v) for k, v in phases.items()},
        }, f)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
