"""One rank of the pretrained-weights test: for each ZeRO case, a transformers model loaded
with from_pretrained (its weights as safetensors maps them) and the same model built from its
config (the same seed, so the same values) each train STEPS steps on 2 ranks; writes
{case: {"loaded": losses, "built": losses}} to OUT.rankN.json.
usage: pretrained_worker.py MODEL DIR STEPS OUT
DIR holds what hf_worker.make(MODEL).save_pretrained wrote (one file or shards)."""
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_worker  # noqa: E402

CASES = {
    "1": {"stage": 1},
    "2": {"stage": 2},
    "3": {"stage": 3, "stage3_param_persistence_threshold": 128},
    "3-offload": {"stage": 3, "stage3_param_persistence_threshold": 128,
                  "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
}


def train(engine, name, steps, rank, world):
    losses = []
    for step in range(steps):
        loss = engine(**hf_worker.inputs(name, step, rank, world)).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def main():
    import zeroshard
    name, folder, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cls = getattr(transformers, hf_worker.CLASSES[name])
    results = {}
    for case, zero in CASES.items():
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
                  "optimizer": {"type": "AdamW", "params": {"lr": hf_worker.LR}},
                  "zero_optimization": zero}
        runs = {}
        for source in ("loaded", "built"):
            if source == "loaded":
                model = cls.from_pretrained(folder, dtype=torch.float32,
                                            attn_implementation="eager")
            else:
                model = hf_worker.make(name)
            model.train()
            engine, _, _, _ = zeroshard.initialize(model=model, config=config)
            runs[source] = train(engine, name, steps, rank, world)
            del engine, model
        results[case] = runs
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
