"""One rank of a Lightning Fabric loop over a small GPT (models.TinyGpt), written as a
Fabric user writes it for DDP: no_backward_sync over an accumulation window of 2, the loss
divided by it, clip_gradients, optimizer and a warmup LambdaLR stepped at the window's end,
fabric.save at every epoch's end; under strategy "ddp" or zeroshard's (a config, or a
registered name). Writes every micro-batch's loss, every step's gradient norm (before
clipping) and the whole parameters to
OUT.rankN.json.
usage: fabric_worker.py OUT JSON  (JSON: strategy, config, epochs, ckpt_dir, resume)"""
import json
import os
import sys

import lightning as L
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from lightning_worker import ACCUMULATION, CLIP, MICRO  # noqa: E402


def strategy_of(spec):
    if spec["strategy"] == "ddp":
        return "ddp"
    from zeroshard.integrations import ZeroShardFabricStrategy
    if spec.get("config") is None:
        return spec["strategy"]  # a registered name
    return ZeroShardFabricStrategy(config=spec["config"])


def main():
    out, spec = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)
    fabric = L.Fabric(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
                      strategy=strategy_of(spec), precision="32-true")
    fabric.launch()
    torch.manual_seed(0)
    model = models.TinyGpt()
    decay = [p for n, p in model.named_parameters() if "ln" not in n]
    rest = [p for n, p in model.named_parameters() if "ln" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": rest, "weight_decay": 0.0}], lr=1e-2,
                                  betas=(0.9, 0.95))
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    model, optimizer = fabric.setup(model, optimizer)
    tokens = torch.randint(models.VOCAB, (32, models.SEQ + 1),
                           generator=torch.Generator().manual_seed(7))
    loader = fabric.setup_dataloaders(
        torch.utils.data.DataLoader(list(tokens), batch_size=MICRO, shuffle=True))
    state = {"model": model, "optimizer": optimizer, "scheduler": warmup, "epoch": -1}
    if spec.get("resume"):
        fabric.load(spec["resume"], state)
    losses, norms = [], []
    # Fabric's loader sets its sampler's epoch to the count of its own iterations.
    loader._num_iter_calls = state["epoch"] + 1
    for epoch in range(state["epoch"] + 1, spec.get("epochs", 2)):
        for i, batch in enumerate(loader):
            accumulating = (i + 1) % ACCUMULATION != 0
            with fabric.no_backward_sync(model, enabled=accumulating):
                loss = model(batch)
                fabric.backward(loss / ACCUMULATION)
            losses.append(loss.item())
            if not accumulating:
                norm = fabric.clip_gradients(model, optimizer, max_norm=CLIP)
                optimizer.step()
                engine = getattr(fabric.strategy, "engine", None)
                # DDP's clip_gradients returns this step's norm; the engine has it after its step.
                norms.append(norm.item() if engine is None else engine.get_global_grad_norm())
                optimizer.zero_grad()
                warmup.step()
        state["epoch"] = epoch
        if spec.get("ckpt_dir"):
            fabric.save(os.path.join(spec["ckpt_dir"], f"epoch{epoch}"), state)
    params = fabric.strategy.get_module_state_dict(model._forward_module)  # DDP's or the engine's
    result = {"losses": losses, "norms": norms, "lr": optimizer.param_groups[0]["lr"],
              "params": {k: v.float().tolist() for k, v in params.items()}}
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
