"""One rank of tests/python/test_buffers.py: a small CNN with BatchNorm trained on data
whose statistics differ per rank, by torch DDP and by zeroshard in several settings, in
one process (the engines one after the other, torch.distributed started first so every
engine joins its store). Writes OUT.rankN.json: for each case, the parameters and
buffers after training, the eval outputs on one input, and the buffers after that
forward.
usage: buffers_worker.py OUT SCRATCH_DIR"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS, MICRO = 6, 4
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


class Block(nn.Module):
    def __init__(self, cin, cout, norm, momentum):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.norm = norm(cout, momentum=momentum)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


class Cnn(nn.Module):
    """Two blocks (stage-3 units) and a head; the second norm keeps a cumulative average
    (momentum None); a non-persistent buffer is read in forward."""

    def __init__(self, norm=nn.BatchNorm2d):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(Block(3, 8, norm, 0.1), Block(8, 8, norm, None))
        self.head = nn.Linear(8, 4)
        self.register_buffer("pixel_mean", torch.tensor([0.1, -0.2, 0.3]).view(1, 3, 1, 1),
                             persistent=False)

    def forward(self, x):
        return self.head(self.blocks(x - self.pixel_mean).mean((2, 3)))


def batch(step, rank, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    x = torch.randn(MICRO, 3, 6, 6, generator=g) * (1 + rank) + 0.5 * rank
    return x, torch.randint(0, 4, (MICRO,), generator=g)


def probe():
    return torch.randn(3, 3, 6, 6, generator=torch.Generator().manual_seed(7))


def loss_of(model, x, y):
    return F.cross_entropy(model(x), y)


def record(model, params, run_eval):
    """Parameters and buffers now; then eval outputs and the buffers after that forward."""
    state = {"params": {n: p.tolist() for n, p in params.items()},
             "buffers": {n: b.clone().tolist() for n, b in model.named_buffers()}}
    model.eval()
    with torch.no_grad():
        state["eval"] = run_eval(probe()).tolist()
    state["buffers_after_eval"] = {n: b.clone().tolist() for n, b in model.named_buffers()}
    model.train()
    return state


def ddp_case(rank, world, broadcast, accumulation=1):
    model = Cnn()
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=broadcast)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(accumulation):
            x, y = batch(step, rank, micro)
            last = micro == accumulation - 1
            with ddp.no_sync() if not last else _nothing():
                (loss_of(ddp, x, y) / accumulation).backward()
        opt.step()
    return record(model, dict(model.named_parameters()), ddp)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def config(stage, offload=False, accumulation=1, broadcast=True):
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": accumulation,
            "broadcast_buffers": broadcast, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                      "weight_decay": WD}}}


def zs_train(engine, rank, steps, accumulation=1, first=0):
    for step in range(first, first + steps):
        for micro in range(accumulation):
            x, y = batch(step, rank, micro)
            engine.backward(loss_of(engine, x, y))
            engine.step()


def zs_case(rank, cfg, accumulation=1, norm=nn.BatchNorm2d):
    import zeroshard
    model = Cnn(norm)
    engine, *_ = zeroshard.initialize(model=model, config=cfg)
    zs_train(engine, rank, STEPS, accumulation)
    out = record(model, engine.full_parameters(), engine)
    kinds = engine.memory_report()["device"]["kinds"]["buffers"]
    out["ledger_buffers"] = [kinds["current"], kinds["predicted"]]
    return out


def sync_reference(world):
    """SyncBatchNorm's meaning computed another way: one process, plain BatchNorm, every
    rank's batch in one (equal batches: the mean loss is the mean of the ranks')."""
    model = Cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for step in range(STEPS):
        xs, ys = zip(*(batch(step, r) for r in range(world)))
        opt.zero_grad()
        loss_of(model, torch.cat(xs), torch.cat(ys)).backward()
        opt.step()
    return record(model, dict(model.named_parameters()), model)


def checkpoint_case(rank, scratch):
    """Stage 3: 6 steps straight, against 3, a checkpoint, a new engine on a new model,
    its load and 3 more. Also the consolidated state_dict of the checkpoint."""
    import zeroshard
    cfg = config(3)
    whole = Cnn()
    engine, *_ = zeroshard.initialize(model=whole, config=cfg)
    zs_train(engine, rank, STEPS)
    whole_params = engine.full_parameters()
    first = Cnn()
    engine, *_ = zeroshard.initialize(model=first, config=cfg)
    zs_train(engine, rank, STEPS // 2)
    ckpt = os.path.join(scratch, "ckpt")
    engine.save_checkpoint(ckpt)
    saved = {n: b.clone() for n, b in first.named_buffers() if n != "pixel_mean"}  # persistent
    resumed = Cnn()
    engine, *_ = zeroshard.initialize(model=resumed, config=cfg)
    engine.load_checkpoint(ckpt)
    zs_train(engine, rank, STEPS - STEPS // 2, first=STEPS // 2)
    resumed_params = engine.full_parameters()
    # A model without running statistics: the load names what it lacks, before any change.
    stateless = Cnn(lambda c, momentum: nn.BatchNorm2d(c, momentum=momentum,
                                                       track_running_stats=False))
    engine, *_ = zeroshard.initialize(model=stateless, config=cfg)
    try:
        engine.load_checkpoint(ckpt)
        refused = ""
    except zeroshard.Error as e:
        refused = str(e)
    out = {"same_buffers": all(torch.equal(a, b) for a, b in
                               zip(whole.buffers(), resumed.buffers())),
           "same_params": all(torch.equal(whole_params[n], p) for n, p in resumed_params.items()),
           "refused": refused}
    if rank == 0:
        zeroshard.consolidate(ckpt, os.path.join(scratch, "consolidated.pt"))
        full = torch.load(os.path.join(scratch, "consolidated.pt"))
        out["consolidated_keys"] = sorted(full)
        out["model_keys"] = sorted(Cnn().state_dict())
        out["consolidated_buffers_are_rank0s"] = all(torch.equal(full[n], b)
                                                     for n, b in saved.items())
    return out


def main():
    out, scratch = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {
        "ddp": ddp_case(rank, world, True),
        "ddp_off": ddp_case(rank, world, False),
        "ddp_acc": ddp_case(rank, world, True, accumulation=2),
    }
    for stage in (0, 1, 2, 3):
        results[f"zs{stage}"] = zs_case(rank, config(stage))
    results["zs2cpu"] = zs_case(rank, config(2, offload=True))
    results["zs3cpu"] = zs_case(rank, config(3, offload=True))
    results["zs2_off"] = zs_case(rank, config(2, broadcast=False))
    results["zs3_acc"] = zs_case(rank, config(3, accumulation=2), accumulation=2)
    results["sync_reference"] = sync_reference(world)
    for stage in (1, 3):
        results[f"zs{stage}_sync"] = zs_case(rank, config(stage), norm=nn.SyncBatchNorm)
    results["checkpoint"] = checkpoint_case(rank, scratch)
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
