"""One rank of test_optimizers.py: the GPT of models.py trained with one torch.optim class
over two parameter groups (matrices with weight decay; biases and norms without, at
their own lr), clipping at 1.0, under torch DDP (mode ddp) or under zeroshard for each
of several configs in turn (mode zs). Writes OUT.rankN.json: the per-step losses of
each run and, from rank 0, the parameters after the last step (OUT.rank0.<i>.pt).
usage: optimizer_worker.py ddp|zs|reference CLASS KWARGS_JSON STEPS OUT [RUNS_JSON]
CLASS Lamb is DeepSpeed's config type (zeroshard runs name it in the config), Adafactor
transformers' class; mode reference trains them in one process on the global batch over
whole parameters (Lamb with DeepSpeed's FusedLamb arithmetic written out below).
Each zs run is {"config": {...}, "via": "client" | "config", "resume_at": N,
"save_to": DIR, "load_from": DIR} (all but config optional): via config names the class
in the config's optimizer section (DeepSpeed's way) instead of passing the optimizer
object; resume_at saves a checkpoint after N steps, builds a new model and engine, loads
it and trains on (the losses and parameters must then be bit-identical to an
uninterrupted run); save_to keeps that checkpoint in DIR, and load_from starts from the
one in DIR (saved at another world size) at the step it was saved.
Each zs run also reports this rank's optimizer state bytes, held and predicted, and
whether zeroshard's own Adam steps it:
{"losses": [...], "optimizer_states": [current, predicted], "own_adam": bool}."""
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


def lamb_step(params, state, lr, wd, betas=(0.9, 0.999), eps=1e-8, max_coeff=10.0,
              min_coeff=0.01):
    """DeepSpeed FusedLamb's step (eps outside the root, bias correction in the step
    size), one whole parameter at a time."""
    b1, b2 = betas
    for p in params:
        m, v, t = state.setdefault(p, [torch.zeros_like(p), torch.zeros_like(p), 0])
        t += 1
        state[p][2] = t
        g = p.grad
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        u = m / (v.sqrt() + eps) + wd * p.detach()
        w_norm, u_norm = p.detach().norm().item(), u.norm().item()
        coeff = min(max(w_norm / u_norm, min_coeff), max_coeff) if w_norm and u_norm else 1.0
        step = lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)
        with torch.no_grad():
            p.add_(u, alpha=-step * coeff)


def train_reference(cls, kwargs, steps):
    """One process, the global batch (what 2 ranks' mean gradient is), with `cls` over
    whole parameters: DeepSpeed's Lamb as lamb_step writes it, or the class itself."""
    model = models.make("gpt")
    opt = None if cls.__name__ == "Lamb" else cls(groups(model), **dict({"lr": LR}, **kwargs))
    state, losses = {}, []
    for step in range(steps):
        model.zero_grad(set_to_none=False)
        loss = model(models.batch(step, 0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        if opt is not None:
            opt.step()
        for g in groups(model) if opt is None else ():
            lamb_step(g["params"], state, g.get("lr", kwargs.get("lr", LR)), g["weight_decay"],
                      **{k: v for k, v in kwargs.items() if k != "lr"})
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def optimizer_class(name):
    """torch.optim's class; Lamb, DeepSpeed's config type (a stand-in carrying the name);
    Adafactor, transformers' (torch.optim has its own, another algorithm);
    DeepSpeedCPUAdam, DeepSpeed's."""
    if name == "DeepSpeedCPUAdam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam
    if name == "Lamb":
        return type("Lamb", (), {})
    if name == "Adafactor":
        from transformers.optimization import Adafactor
        return Adafactor
    return getattr(torch.optim, name)


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
    offload = run["config"]["zero_optimization"].get("offload_optimizer", {})
    tier = {"cpu": "host", "nvme": "nvme"}.get(offload.get("device"), "device")
    held = engine.memory_report()[tier]["kinds"]["optimizer_states"]
    report = {"losses": losses, "optimizer_states": [held["current"], held["predicted"]],
              "own_adam": engine._torch_optimizer is None}  # not a class the package steps
    return report, engine.state_dict()


def main():
    mode, name, kwargs, steps, out = (sys.argv[1], sys.argv[2], json.loads(sys.argv[3]),
                                      int(sys.argv[4]), sys.argv[5])
    torch.set_num_threads(1)
    cls = optimizer_class(name)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = []
    if mode == "reference":
        losses, params = train_reference(cls, kwargs, steps)
        results.append(losses)
        torch.save(params, f"{out}.rank0.0.pt")
    elif mode == "ddp":
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
