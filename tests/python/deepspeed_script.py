"""A training script written the way DeepSpeed's examples are (cifar10_deepspeed.py,
the getting-started page): argparse with add_config_arguments, init_distributed,
get_accelerator, deepspeed.comm for logging, zero.Init at stage 3, GatheredParameters
around an export, the engine's accessors, checkpoints with client_state (with
--load_weights_only, loaded without the optimizer's state).
tests/python/test_deepspeed_script.py runs it with DeepSpeed and, its three import lines
pointed at zeroshard, with zeroshard. Writes what it saw to --out as JSON."""
import argparse
import json
import os

import torch
import torch.nn as nn

import deepspeed
import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator

STEPS, ACCUMULATION, ROWS = 6, 2, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 5)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def add_argument():
    parser = argparse.ArgumentParser(description="deepspeed-style")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--resume_from", help="resume from this checkpoint (default: --checkpoint)")
    parser.add_argument("--load_weights_only", action="store_true",
                        help="resume with load_optimizer_states=False: the moments stay")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def batch(step, micro, rank):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(ROWS, 12, generator=g), torch.randint(5, (ROWS,), generator=g)


def main():
    args = add_argument()
    given_local_rank = args.local_rank
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    if args.local_rank < 0:
        args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    get_accelerator().set_device(args.local_rank)
    with open(args.deepspeed_config) as f:
        stage = json.load(f)["zero_optimization"]["stage"]
    torch.manual_seed(0)
    with deepspeed.zero.Init(enabled=stage == 3, config_dict_or_path=args.deepspeed_config):
        net = Net()
    with deepspeed.zero.GatheredParameters(net.fc3.bias, modifier_rank=0):
        if dist.get_rank() == 0:
            net.fc3.bias.data.fill_(0.25)  # rank 0's initialisation reaches every rank
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=net,
                                                   model_parameters=net.parameters())
    criterion = nn.CrossEntropyLoss()
    seen = {"stage": engine.zero_optimization_stage(), "fp16": engine.fp16_enabled(),
            "bf16": engine.bfloat16_enabled(), "local_rank": engine.local_rank,
            "global_rank": engine.global_rank, "world_size": engine.world_size,
            "train_batch_size": engine.train_batch_size(),
            "micro_batch": engine.train_micro_batch_size_per_gpu(),
            "accumulation": engine.gradient_accumulation_steps(),
            "device": str(engine.device), "rank": dist.get_rank(),
            "local": dist.get_local_rank(), "ranks": dist.get_world_size(),
            "accelerator": get_accelerator().device_name()}
    losses, boundaries, applied, norms, lrs = [], [], [], [], [engine.get_lr()]
    for step in range(STEPS):
        if step == STEPS // 2:
            engine.save_checkpoint(args.checkpoint, client_state={"step": step})
        for micro in range(ACCUMULATION):
            x, y = batch(step, micro, dist.get_rank())
            loss = criterion(engine(x.to(engine.device)), y.to(engine.device))
            boundaries.append(engine.is_gradient_accumulation_boundary())
            engine.backward(loss)
            engine.step()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            losses.append(logged.item() / dist.get_world_size())
        applied.append(engine.was_step_applied())
        lrs.append(engine.get_lr())
        norms.append(float(engine.get_global_grad_norm()))
    seen.update(global_steps=engine.global_steps, global_samples=engine.global_samples,
                dp_world_size=engine.dp_world_size, mp_world_size=engine.mp_world_size,
                gradient_clipping=engine.gradient_clipping())
    _, client = engine.load_checkpoint(args.resume_from or args.checkpoint,
                                       load_optimizer_states=not args.load_weights_only)
    seen["steps_loaded"] = engine.global_steps
    resumed, resumed_lrs = [], [engine.get_lr()]
    for step in range(client["step"], STEPS):
        for micro in range(ACCUMULATION):
            x, y = batch(step, micro, dist.get_rank())
            loss = criterion(engine(x.to(engine.device)), y.to(engine.device))
            engine.backward(loss)
            engine.step()
            resumed.append(loss.item())
        resumed_lrs.append(engine.get_lr())
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        export = {n: p.detach().double().sum().item() for n, p in engine.module.named_parameters()}
    saved = engine.save_16bit_model(args.checkpoint + "-16bit", "model.bin")
    dist.barrier()  # rank 0 writes it; DeepSpeed returns before that is done on every rank
    whole = torch.load(os.path.join(args.checkpoint + "-16bit", "model.bin"))
    dist.barrier()
    with open(f"{args.out}.rank{dist.get_rank()}.json", "w") as f:
        json.dump(dict(seen, losses=losses, boundaries=boundaries, applied=applied, norms=norms,
                       lrs=lrs, resumed_lrs=resumed_lrs,
                       given_local_rank=given_local_rank, resumed_step=client["step"], resumed=resumed, export=export,
                       saved=saved, saved_sums={k: v.double().sum().item()
                                                for k, v in whole.items()}), f)


if __name__ == "__main__":
    main()
