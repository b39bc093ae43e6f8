"""One rank of test_optimizers.py: the GPT of models.py trained with one torch.optim class
over two parameter groups (matrices with weight decay; biases and norms without, at
their own lr), clipping at 1.0, under torch DDP (mode ddp) or under zeroshard for each
of several configs in turn (mode zs). Writes OUT.rankN.json: the per-step losses of
each run and, from rank 0, the parameters after the last step (OUT.rank0.<i>.pt).
usage: optimizer_worker.py ddp|zs CLASS KWARGS_JSON STEPS OUT [RUNS_JSON]
Each zs run is {"config": {...}, "via": "client" | "config", "resume_at": N,
"save_to": DIR, "load_from": DIR} (all but config optional): via config names the class
in the config's optimizer section (DeepSpeed's way) instead of passing the optimizer
object; resume_at saves a checkpoint after N steps, builds a new model and engine, loads
it and trains on (the losses and parameters must then be bit-identical to an
uninterrupted run); save_to keeps that checkpoint in DIR, and load_from starts from the
one in DIR (saved at another world size) at the step it was saved.
Each zs run also reports this rank's optimizer state bytes, held and predicted:
{"losses": [...], "optimizer_states": [current, predicted]}."""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

LR, NO_DECAY_LR, WD, CLIP = 1e-2, 3e-3, 0.05, 1.0


def groups(model):
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": WD},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0,
             "lr": NO_DECAY_LR}]


def train_ddp(cls, kwargs, steps, rank, world):
    dist.init_process_group("gloo")
    model = models.make("gpt")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = cls(groups(model), **dict({"lr": LR}, **kwargs))
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=False)
        loss = ddp(models.batch(step, rank, world))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    dist.destroy_process_group()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def engine_for(cls, kwargs, run):
    import zeroshard
    model = models.make("gpt")
    config = dict(run["config"], gradient_clipping=CLIP)
    if run.get("via") == "config":
        config["optimizer"] = {"type": cls.__name__, "params": dict({"lr": LR}, **kwargs)}
        engine, *_ = zeroshard.initialize(model=model, config=config,
                                          model_parameters=groups(model))
    else:
        engine, *_ = zeroshard.initialize(model=model, config=config,
                                          optimizer=cls(groups(model), **dict({"lr": LR}, **kwargs)))
    return engine


def train_zs(cls, kwargs, steps, run, scratch):
    engine = engine_for(cls, kwargs, run)
    rank, world = engine.rank, engine.world_size
    losses, resume_at, first = [], run.get("resume_at"), 0
    scratch = run.get("save_to", scratch)
    if run.get("load_from"):
        _, client = engine.load_checkpoint(run["load_from"])
        first = client["next_step"]
    for step in range(first, steps):
        if step == resume_at:
            engine.save_checkpoint(scratch, client_state={"next_step": step})
            engine = engine_for(cls, kwargs, run)  # a new model and engine, from the file
            engine.load_checkpoint(scratch)
        loss = engine(models.batch(step, rank, world))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    tier = "host" if "offload_optimizer" in run["config"]["zero_optimization"] else "device"
    held = engine.memory_report()[tier]["kinds"]["optimizer_states"]
    report = {"losses": losses, "optimizer_states": [held["current"], held["predicted"]]}
    return report, engine.state_dict()


def main():
    mode, name, kwargs, steps, out = (sys.argv[1], sys.argv[2], json.loads(sys.argv[3]),
                                      int(sys.argv[4]), sys.argv[5])
    torch.set_num_threads(1)
    cls = getattr(torch.optim, name)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = []
    if mode == "ddp":
        losses, params = train_ddp(cls, kwargs, steps, rank, world)
        results.append(losses)
        if rank == 0:
            torch.save(params, f"{out}.rank0.0.pt")
    else:
        for i, run in enumerate(json.loads(sys.argv[6])):
            losses, params = train_zs(cls, kwargs, steps, run, f"{out}.ckpt{i}")
            results.append(losses)
            if rank == 0:
                torch.save(params, f"{out}.rank0.{i}.pt")
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
