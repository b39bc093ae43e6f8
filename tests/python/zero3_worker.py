"""One rank of tests/python/test_zero3_models.py: Hugging Face models built from small
configs (hf_worker.CONFIGS), trained one after the other in this process for STEPS steps
each: by zeroshard at stage 3 with no units given (mode zs, the config as JSON), or alone
on the whole global batch with torch's AdamW (mode single, one process). Writes
OUT.rankN.json: {model: {"losses": [...], and in mode zs "memory": what the engine holds
after the last step}}, and OUT.MODEL.config.json (rank 0): the model's config.json.
usage: zero3_worker.py single|zs MODELS STEPS OUT [CONFIG_JSON]   MODELS: comma-separated"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_worker  # noqa: E402

LR, BETAS, EPS, WD, CLIP = hf_worker.LR, hf_worker.BETAS, hf_worker.EPS, hf_worker.WD, hf_worker.CLIP


def train_single(name, steps):
    model = hf_worker.make(name)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=False)
        loss = model(**hf_worker.inputs(name, step, 0, 1)).loss
        loss.backward()
        # A parameter the loss does not reach (CLIP's pooled-output norm in llava) has a
        # zero gradient under zeroshard (its rule, and DeepSpeed's); AdamW would skip None.
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return {"losses": losses}


def held_by_parameters(model):
    """Bytes of memory the model's parameter tensors point at (each storage once)."""
    with torch._C.DisableTorchFunctionSubclass():
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                    for p in model.parameters()}
    return sum(storages.values())


def train_zs(name, steps, config, out):
    import zeroshard
    model = hf_worker.make(name)
    model.train()
    engine, _, _, _ = zeroshard.initialize(model=model, config=config)
    losses = []
    for step in range(steps):
        loss = engine(**hf_worker.inputs(name, step, engine.rank, engine.world_size)).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if engine.rank == 0:
        model.config.to_json_file(f"{out}.{name}.config.json")
    kinds = engine.memory_report()["device"]["kinds"]
    return {"losses": losses, "memory": {
        "kinds": kinds,
        "units": [sum(p.numel() for _, p in ps) for _, ps in engine._units],
        "parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "held_by_parameters": held_by_parameters(model)}}


def main():
    mode, names, steps, out = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    config = json.loads(sys.argv[5]) if mode == "zs" else None
    results = {}
    for name in names:
        results[name] = (train_zs(name, steps, config, out) if mode == "zs"
                         else train_single(name, steps))
    rank = int(os.environ.get("RANK", 0))
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
