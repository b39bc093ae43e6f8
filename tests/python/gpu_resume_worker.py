"""One process (tests/python/test_gpu_streams.py): a checkpoint saved on DEVICE resumes
bit-exactly. The model of models.py with a frozen parameter, a tied one, one used twice
and one skipped on some steps, at stage 3 with its optimizer on the device (OFFLOAD none)
or the host (cpu): 6 steps straight, against 3, a checkpoint, a new engine on a new model,
its load and 3 more. Each step scales its loss by a draw from DEVICE's generator, as
dropout would, from a seed set for each engine: the resumed run draws what the straight
one drew only where the checkpoint brought that generator's state back (on a GPU, the
CUDA generator beside the CPU's). Writes both runs' losses and whether every parameter, the frozen one
too, came out the same to OUT.rank0.json.
usage: gpu_resume_worker.py DEVICE OFFLOAD SCRATCH OUT"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

STEPS = 6


def engine_for(device, offload):
    import zeroshard
    torch.manual_seed(0)  # the CPU's and every GPU's generator
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    config = {"train_micro_batch_size_per_gpu": models.GLOBAL_ROWS,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
              "zero_optimization": zero}
    model = models.make("hf").to(device)
    engine, _, _, _ = zeroshard.initialize(model=model, config=config,
                                           model_parameters=model.parameters())
    return engine


def train(engine, device, first, last):
    losses = []
    for step in range(first, last):
        loss = engine(models.batch(step, 0, 1).to(device))
        loss = loss * (1 + torch.rand((), device=device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def main():
    device, offload, scratch, out = sys.argv[1:5]
    straight = engine_for(device, offload)
    straight_losses = train(straight, device, 0, STEPS)
    straight_params = straight.full_parameters()
    del straight
    first = engine_for(device, offload)
    resumed_losses = train(first, device, 0, STEPS // 2)
    ckpt = os.path.join(scratch, "ckpt")
    first.save_checkpoint(ckpt)
    del first
    resumed = engine_for(device, offload)
    resumed.load_checkpoint(ckpt)
    resumed_losses += train(resumed, device, STEPS // 2, STEPS)
    resumed_params = resumed.full_parameters()
    differ = [n for n, p in resumed_params.items()
              if not torch.equal(p.cpu(), straight_params[n].cpu())]
    with open(f"{out}.rank0.json", "w") as f:
        json.dump({"straight": straight_losses, "resumed": resumed_losses,
                   "params": sorted(resumed_params), "differ": differ}, f)


if __name__ == "__main__":
    main()
