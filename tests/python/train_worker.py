"""One rank of a Python test: trains a model from models.py with torch DDP + AdamW
(mode ddp) or zeroshard (mode zs, a config given as JSON) and writes the per-step
losses (this rank's) to OUT.rankN.json.
usage: train_worker.py ddp|zs MODEL STEPS OUT [CONFIG_JSON]"""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0


def main():
    mode, name, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = models.make(name)
    write = os.environ.get("ZS_TEST_WRITE") == "1"  # overwrite parameters before training
    losses = []
    if mode == "ddp":
        dist.init_process_group("gloo")
        if write:
            with torch.no_grad():
                model.blocks[0].fc1.weight.fill_(0.01)
                model.ln_f.weight.fill_(0.9)
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=(name == "hf"))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                                betas=BETAS, eps=EPS, weight_decay=WD)
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
            losses.append(loss.item())
    else:
        import zeroshard
        config = json.loads(sys.argv[5])
        engine, _, _, _ = zeroshard.initialize(model=model, config=config,
                                               units=models.units_of(name, model))
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
            loss = engine(models.batch(step, rank, world))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        if os.environ.get("ZS_DUMP_PARAMS") == "1":
            torch.save(engine.state_dict(), f"{out}.rank{rank}.pt")
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
