"""One rank of a Python test: trains a model from models.py with torch DDP + AdamW
(mode ddp) or zeroshard (mode zs, a config given as JSON) and writes the per-step
losses (this rank's) to OUT.rankN.json.
usage: train_worker.py ddp|zs MODEL STEPS OUT [CONFIG_JSON]
ZS_TEST_OPTIMIZER picks how the optimizer is set up, the same way in both modes:
  groups       parameter groups (decay and no-decay, every hyperparameter different),
               zeroshard given them as model_parameters
  client       torch.optim.AdamW over those groups and a LambdaLR made by a callable,
               zeroshard given both as initialize(optimizer=, lr_scheduler=)
  client_adam  torch.optim.Adam (L2 decay) over those groups and a StepLR built on it
ZS_TEST_MODULE_ZERO_GRAD=1: a zeroshard run calls model.zero_grad() before each forward.
ZS_TEST_INIT_DIST=1: a zeroshard run initialises torch.distributed first, as scripts
that call deepspeed.init_distributed() (or accelerate) do, and makes a first engine
before the one it trains with."""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0


def param_groups(model):
    """nanoGPT's split: matrices decay, biases and norms do not (own lr, betas, eps)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": WD},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0, "lr": 3e-3,
             "betas": (0.8, 0.9), "eps": 1e-6}]


def make_optimizer(model, how):
    """(optimizer, scheduler or a callable making one) for ZS_TEST_OPTIMIZER=how."""
    if how == "client_adam":
        opt = torch.optim.Adam(param_groups(model), lr=LR, betas=BETAS, eps=EPS)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    opt = torch.optim.AdamW(param_groups(model) if how else
                            [p for p in model.parameters() if p.requires_grad],
                            lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    if how == "client":
        return opt, lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (1 + 0.3 * s))
    return opt, None


def main():
    mode, name, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    # Under mpirun or srun (tests/python/test_launchers.py) only the engine knows: below.
    rank, world = int(os.environ.get("RANK", -1)), int(os.environ.get("WORLD_SIZE", -1))
    model = models.make(name)
    write = os.environ.get("ZS_TEST_WRITE") == "1"  # overwrite parameters before training
    losses = []
    how = os.environ.get("ZS_TEST_OPTIMIZER", "")
    if mode == "ddp":
        dist.init_process_group("gloo")
        if write:
            with torch.no_grad():
                model.blocks[0].fc1.weight.fill_(0.01)
                model.ln_f.weight.fill_(0.9)
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=(name == "hf"))
        opt, scheduler = make_optimizer(model, how)
        if callable(scheduler):
            scheduler = scheduler(opt)
        for step in range(steps):
            opt.zero_grad(set_to_none=False)
            loss = ddp(models.batch(step, rank, world))
            loss.backward()
            # A parameter no rank used has a zero gradient under zeroshard (its rule, and
            # DeepSpeed's); torch 2.x's DDP leaves it None and AdamW would skip it.
            for p in model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(loss.item())
    else:
        import zeroshard
        config = json.loads(sys.argv[5])
        if os.environ.get("ZS_TEST_INIT_DIST") == "1":  # as deepspeed.init_distributed() does
            dist.init_process_group("gloo")
            # A first engine in the same store (on a model of its own), gone before the
            # real one: the second must not read the first's keys.
            zeroshard.initialize(model=models.make(name), config=config)
        kwargs = {}
        if how == "groups":
            kwargs["model_parameters"] = param_groups(model)
        elif how:
            config.pop("optimizer")  # the client's optimizer replaces the config's
            kwargs["optimizer"], kwargs["lr_scheduler"] = make_optimizer(model, how)
        engine, _, _, _ = zeroshard.initialize(model=model, config=config,
                                               units=models.units_of(name, model), **kwargs)
        rank, world = engine.rank, engine.world_size
        if write:  # rank 0 writes; the others must receive its values
            with engine.gathered_parameters(model, modifier_rank=0):
                if rank == 0:
                    model.blocks[0].fc1.weight.fill_(0.01)
                    model.ln_f.weight.fill_(0.9)
        first = 0
        if os.environ.get("ZS_CKPT_LOAD"):
            _, client = engine.load_checkpoint(os.environ["ZS_CKPT_LOAD"])
            first = client["next_step"]
        save_at = [int(s) for s in os.environ.get("ZS_CKPT_SAVE_AT", "").split(",") if s]
        for step in range(first, steps):
            if step in save_at:
                engine.save_checkpoint(os.environ["ZS_CKPT_DIR"], client_state={"next_step": step})
                if os.environ.get("ZS_CKPT_STOP") == "1":
                    break
            if os.environ.get("ZS_TEST_MODULE_ZERO_GRAD") == "1":
                model.zero_grad()  # set_to_none, as the Hugging Face Trainer calls it
            loss = engine(models.batch(step, rank, world))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        if os.environ.get("ZS_DUMP_PARAMS") == "1":
            torch.save(engine.state_dict(), f"{out}.rank{rank}.pt")
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(losses, f)
    # A Gloo group left to the interpreter's exit can abort it ("terminate called without
    # an active exception", pytorch/pytorch#190489): the reference runs end theirs here.
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
