"""A DeepSpeed training script that records, per optimizer step, every number DeepSpeed
exposes: the loss of each micro-batch (the mean over ranks), get_lr() and get_mom() of every
parameter group, the loss scale, skipped_steps, get_global_grad_norm(), global_steps and
global_samples; and the parameters at the end. It runs a table of cases (--cases, JSON:
name -> case) one engine after the other in this process, and writes {name: record} to
--out.rankN.json.
tests/python/test_deepspeed_numbers.py runs it with DeepSpeed (its CPU accelerator, Gloo)
and, with its import lines pointed at zeroshard, with zeroshard.

A case: {"config": a DeepSpeed config fragment over BASE, "steps": optimizer steps,
"groups": true for two parameter groups with their own lr and weight decay,
"client_optimizer": a torch.optim class name built by the script (with "client_kwargs"),
"client_scheduler": true for a torch StepLR the script builds, "overflow_at": micro-steps
whose loss is multiplied by inf (fp16), "dtype": the batch's dtype}.
With --loss_scaler (DeepSpeed only) it also drives DeepSpeed's own DynamicLossScaler through
an overflow sequence and writes the scales it takes."""
import argparse
import json
import math

import torch
import torch.nn as nn

import deepspeed
import deepspeed.comm as dist

BASE = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "steps_per_print": 10**9,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}
FEATURES, CLASSES = 12, 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def merged(base, fragment):
    out = dict(base)
    for key, value in fragment.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def batch(step, micro, rank, rows, dtype):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(rows, FEATURES, generator=g)
    return x.to(getattr(torch, dtype)), torch.randint(CLASSES, (rows,), generator=g)


def parameter_groups(net, grouped):
    if not grouped:
        return net.parameters()
    return [{"params": list(net.fc1.parameters()) + list(net.fc2.parameters())},
            {"params": list(net.fc3.parameters()), "lr": 3e-3, "weight_decay": 0.0}]


def run_case(case):
    config = merged(BASE, case.get("config", {}))
    torch.manual_seed(0)
    net = Net()
    dtype = case.get("dtype", "float32")
    if dtype != "float32":
        net = net.to(getattr(torch, dtype))
    params = parameter_groups(net, case.get("groups", False))
    optimizer = None
    if case.get("client_optimizer"):
        config.pop("optimizer", None)
        optimizer = getattr(torch.optim, case["client_optimizer"])(
            params, **case.get("client_kwargs", {}))
        params = None
    scheduler = None
    if case.get("client_scheduler"):
        def scheduler(opt):
            return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=params,
                                           optimizer=optimizer, lr_scheduler=scheduler,
                                           config=config)
    criterion = nn.CrossEntropyLoss()
    record = {"lr": [engine.get_lr()], "mom": [engine.get_mom()], "loss": [], "scale": [],
              "skipped": [], "norm": [], "global_steps": [], "global_samples": [],
              "micro": engine.train_micro_batch_size_per_gpu(),
              "accumulation": engine.gradient_accumulation_steps(),
              "train_batch_size": engine.train_batch_size()}
    overflow_at = set(case.get("overflow_at", []))
    micro_steps = 0
    for step in range(case.get("steps", 8)):
        for micro in range(engine.gradient_accumulation_steps()):
            x, y = batch(step, micro, dist.get_rank(), engine.train_micro_batch_size_per_gpu(),
                         dtype)
            loss = criterion(engine(x).float(), y)
            if micro_steps in overflow_at:
                loss = loss * math.inf
            micro_steps += 1
            engine.backward(loss)
            engine.step()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            record["loss"].append(logged.item() / dist.get_world_size())
        record["lr"].append(engine.get_lr())
        record["mom"].append(engine.get_mom())
        record["scale"].append(float(engine.optimizer.cur_scale)
                               if hasattr(engine.optimizer, "cur_scale") else None)
        record["skipped"].append(engine.skipped_steps)
        norm = engine.get_global_grad_norm()
        record["norm"].append(None if norm is None else float(norm))
        record["global_steps"].append(engine.global_steps)
        record["global_samples"].append(engine.global_samples)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        record["params"] = {n: p.detach().double().flatten().tolist()
                            for n, p in engine.module.named_parameters()}
    return record


def loss_scaler_sequence(overflows, power, window, hysteresis, min_scale):
    """DeepSpeed's DynamicLossScaler driven by `overflows` (one per step): its scale after
    each step."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    scaler = DynamicLossScaler(init_scale=2.0**power, scale_window=window, min_scale=min_scale,
                               delayed_shift=hysteresis, consecutive_hysteresis=False)
    scales = []
    for overflow in overflows:
        scaler.update_scale(overflow)
        scales.append(float(scaler.cur_scale))
    return scales


def main():
    parser = argparse.ArgumentParser(description="DeepSpeed's numbers, step by step")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--loss_scaler", help="JSON: overflows, power, window, hysteresis, "
                                              "min_scale (DeepSpeed's DynamicLossScaler)")
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    results = {}
    for name, case in json.loads(args.cases).items():
        try:
            results[name] = run_case(case)
        except Exception as e:  # noqa: BLE001 - the test names what could not run, and why
            results[name] = {"error": f"{type(e).__name__}: {e}"}
    if args.loss_scaler:
        results["loss_scaler"] = loss_scaler_sequence(**json.loads(args.loss_scaler))
    with open(f"{args.out}.rank{dist.get_rank()}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
