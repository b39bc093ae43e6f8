"""One rank of tests/python/test_zero3_models.py: Hugging Face models built from small
configs (hf_worker.CONFIGS), trained one after the other in this process for STEPS steps
each: by zeroshard at stage 3 with no units given (mode zs, the config as JSON), or alone
on the whole global batch with torch's AdamW (mode single, one process). Writes
OUT.rankN.json: {model: {"losses": [...], and in mode zs "memory": what the engine holds
after the last step, "probe": what code outside training saw halfway}}, and
OUT.MODEL.config.json (rank 0): the model's config.json.
usage: zero3_worker.py single|zs MODELS STEPS OUT [CONFIG_JSON]   MODELS: comma-separated"""
import gc
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


def probe(name, engine, model):
    """Between two steps, as scripts do: read a parameter (every rank alike), and generate
    greedily (forwards without gradients); rank 0 also generates with a plain model given
    the engine's state_dict."""
    full = engine.state_dict()  # a collective
    weight = model.get_input_embeddings().weight
    key = next(n for n, p in model.named_parameters() if p is weight)
    seen = {"read": float(weight.sum()), "whole": float(full[key].sum())}
    if name == "llava":
        return seen
    prompt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    with torch.no_grad():
        seen["generated"] = model.generate(input_ids=prompt, max_new_tokens=4,
                                           do_sample=False).tolist()
        if engine.rank == 0:
            plain = hf_worker.make(name)
            plain.load_state_dict(full)
            seen["plain"] = plain.generate(input_ids=prompt, max_new_tokens=4,
                                           do_sample=False).tolist()
    model.train()
    return seen


def train_zs(name, steps, config, out):
    import zeroshard
    model = hf_worker.make(name)
    model.train()
    engine, _, _, _ = zeroshard.initialize(model=model, config=config)
    losses, seen = [], None
    for step in range(steps):
        if step == steps // 2:
            seen = probe(name, engine, model)
        loss = engine(**hf_worker.inputs(name, step, engine.rank, engine.world_size)).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if engine.rank == 0:
        model.config.to_json_file(f"{out}.{name}.config.json")
    kinds = engine.memory_report()["device"]["kinds"]
    return {"losses": losses, "probe": seen, "memory": {
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
        gc.collect()  # the engine, its hooks a cycle with the model, before the next one
    rank = int(os.environ.get("RANK", 0))
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
