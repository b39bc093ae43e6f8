"""One rank of the soak: the demo (examples/train_gpt.py's model, configs/demo_zero3_nvme.yaml
with nvme_path moved) for STEPS steps, recording after every step this process's RSS and
the ledger's bytes per tier/kind: their values at step WARM and their largest after it
(kept as running maxima, so the record itself does not grow).
usage: soak_worker.py STEPS WARM NVME_DIR OUT"""
import importlib.util
import json
import os
import sys

import torch
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("train_gpt", os.path.join(ROOT, "examples",
                                                                         "train_gpt.py"))
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)
import zeroshard  # noqa: E402  (after train_gpt, which imports it the same way)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    steps, warm, nvme, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    with open(os.path.join(ROOT, "configs", "demo_zero3_nvme.yaml")) as f:
        config = yaml.safe_load(f)
    config["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme
    config["scheduler"]["params"]["total_num_steps"] = steps
    data, chars, _ = demo.load_text()
    torch.manual_seed(0)
    seq = 64
    model = demo.Gpt(len(chars), 192, 6, 6, seq)
    engine, _, _, _ = zeroshard.initialize(model=model, config=config)
    micro = engine._engine.micro_batch_size
    gen = torch.Generator().manual_seed(100 + engine.rank)
    rss, losses = [0] * steps, [0.0] * steps
    at_warm, largest = {}, {}
    for step in range(steps):
        starts = torch.randint(len(data) - seq - 1, (micro,), generator=gen)
        batch = torch.stack([data[s:s + seq + 1] for s in starts])
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        losses[step] = loss.item()
        rss[step] = rss_bytes()
        row = {}
        for tier, t in engine.memory_report().items():
            row[f"{tier} peak"] = t["peak"]
            for kind, k in t["kinds"].items():
                row[f"{tier}/{kind}"] = k["current"]
                row[f"{tier}/{kind} peak"] = k["peak"]
        if step == warm:
            at_warm = row
        elif step > warm:
            largest = {k: max(v, largest.get(k, 0)) for k, v in row.items()}
    with open(f"{out}.rank{engine.rank}.json", "w") as f:
        json.dump({"rss": rss, "at_warm": at_warm, "largest": largest, "losses": losses}, f)


if __name__ == "__main__":
    main()
