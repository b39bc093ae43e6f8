"""One rank of tests/python/test_load_options.py: DeepSpeed's save_checkpoint and
load_checkpoint keywords on the GPT of models.py with block 0's LayerNorm frozen, the
config's AdamW and a client LambdaLR. Mode zs (CONFIG_JSON, the checkpoint folder CKPT):
6 steps, saved twice (global_step6 without the frozen parameters; `whole` with them,
without moving `latest`), 6 more; then fresh engines load what each keyword asks and train
the same 6 steps. Writes OUT.rankN.json (what it saw) and, rank 0, OUT.NAME.pt (the
parameters after each run). Mode ddp: the reference, torch DDP with torch's AdamW from
the step-6 weights (OUT.w6.pt), the scheduler's state that of one advanced by SCHEDULED
steps; writes OUT.ddp.rankN.json (losses) and, rank 0, OUT.ddp.pt.
usage: load_options_worker.py zs CONFIG_JSON CKPT OUT | ddp OUT SCHEDULED"""
import gc
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

STEPS, LR, BETAS, EPS, WD, CLIP = 6, 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
FROZEN = "blocks.0.ln.weight"


def make_model(frozen=True):
    model = models.make("gpt")
    if frozen:
        model.blocks[0].ln.requires_grad_(False)
    return model


def schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + 0.3 * s))


def engine_for(config, model=None, scheduler=schedule):
    import zeroshard
    engine, _, _, _ = zeroshard.initialize(model=model or make_model(), config=config,
                                           lr_scheduler=scheduler)
    return engine


def train(engine, first):
    losses = []
    for step in range(first, first + STEPS):
        loss = engine(models.batch(step, engine.rank, engine.world_size))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def error_of(fn):
    import zeroshard
    try:
        fn()
    except zeroshard.Error as e:
        return str(e)
    return None


def keep(engine, out, name):
    state = engine.state_dict()  # a collective
    if engine.rank == 0:
        torch.save(state, f"{out}.{name}.pt")


def saving(config, ckpt, out, seen):
    first = engine_for(config)
    train(first, 0)
    keep(first, out, "w6")
    seen["tag"] = first.save_checkpoint(ckpt, exclude_frozen_parameters=True)
    first.save_checkpoint(ckpt, tag="whole", save_latest=False)
    with open(os.path.join(ckpt, "latest")) as f:
        seen["latest"] = f.read().strip()
    seen["uninterrupted"] = train(first, STEPS)
    keep(first, out, "uninterrupted")


def loading(config, ckpt, out, seen):
    resumed = engine_for(config)
    seen["strict_error"] = error_of(lambda: resumed.load_checkpoint(ckpt))
    path, _ = resumed.load_checkpoint(ckpt, load_module_strict=False)
    seen["resumed_path"], seen["resumed_steps"] = path, resumed.global_steps
    seen["resumed"] = train(resumed, STEPS)
    keep(resumed, out, "resumed")
    for name, kwargs in (("weights_only", {"load_optimizer_states": False}),
                         ("module_only", {"load_module_only": True})):
        engine = engine_for(config)
        engine.load_checkpoint(ckpt, tag="whole", **kwargs)
        seen[name + "_at"] = [engine.global_steps, engine.lr_scheduler.last_epoch]
        seen[name] = train(engine, STEPS)
        seen[name + "_after"] = engine.global_steps
        keep(engine, out, name)
        del engine
        gc.collect()


def refusals(config, ckpt, out, seen):
    # Block 0's LayerNorm trains here: its optimizer state is not in global_step6.
    engine = engine_for(config, make_model(frozen=False))
    seen["trainable_missing_error"] = error_of(
        lambda: engine.load_checkpoint(ckpt, load_module_strict=False))
    engine.load_checkpoint(ckpt, load_module_strict=False, load_optimizer_states=False)
    keep(engine, out, "kept")
    seen["no_latest"] = engine.load_checkpoint(os.path.join(ckpt, "empty"))
    seen["custom_load_fn"] = error_of(
        lambda: engine.load_checkpoint(ckpt, custom_load_fn=lambda src, dst: None))
    loss = engine(models.batch(0, engine.rank, engine.world_size))
    seen["scale_wrt_gas"] = error_of(lambda: engine.backward(loss, scale_wrt_gas=False))


def config_schedule(config, ckpt, seen):
    """A config scheduler's position: the checkpoint's unless load_lr_scheduler_states
    is False."""
    scheduled = dict(config, scheduler={"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": LR, "warmup_num_steps": 10,
        "warmup_type": "linear"}})
    lrs = {}
    for name, kwargs in (("fresh", None), ("full", {}),
                         ("weights_only", {"load_optimizer_states": False}),
                         ("kept_position", {"load_optimizer_states": False,
                                            "load_lr_scheduler_states": False})):
        engine = engine_for(scheduled, scheduler=None)
        if kwargs is not None:
            engine.load_checkpoint(ckpt, tag="whole", load_module_strict=False, **kwargs)
        lrs[name] = [engine.get_lr()[0], engine.global_steps]
        del engine
        gc.collect()
    seen["config_schedule"] = lrs


def ddp(out, scheduled):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    model.load_state_dict(torch.load(f"{out}.w6.pt"))
    trained = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                            betas=BETAS, eps=EPS, weight_decay=WD)
    sched = schedule(opt)
    # The scheduler's state alone, as a load gives it: the optimizer's lr moves at the
    # scheduler's next step (as under DeepSpeed, whose optimizer state holds the lr).
    other = schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR))
    with warnings.catch_warnings():  # stepped without optimizer steps, on purpose
        warnings.simplefilter("ignore")
        for _ in range(scheduled):
            other.step()
    sched.load_state_dict(other.state_dict())
    losses = []
    for step in range(STEPS, 2 * STEPS):
        opt.zero_grad()
        loss = trained(models.batch(step, rank, world))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        losses.append(loss.item())
    if rank == 0:
        torch.save(model.state_dict(), f"{out}.ddp.pt")
    with open(f"{out}.ddp.rank{rank}.json", "w") as f:
        json.dump(losses, f)
    dist.destroy_process_group()


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "ddp":
        return ddp(sys.argv[2], int(sys.argv[3]))
    config, ckpt, out = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    seen = {}
    saving(config, ckpt, out, seen)
    gc.collect()
    loading(config, ckpt, out, seen)
    gc.collect()
    refusals(config, ckpt, out, seen)
    gc.collect()
    config_schedule(config, ckpt, seen)
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
