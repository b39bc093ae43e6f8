"""One rank of the soak: the demo (examples/train_gpt.py's model at half its width,
configs/demo_zero3_nvme.yaml with nvme_path moved and sub-groups to match) for STEPS steps,
recording after every step this process's RSS, the bytes malloc has live, the blocks
Python's allocator has live, and as exact counts the ledger's bytes per tier/kind, the
threads and the open file descriptors: those counts at step WARM and their largest after it
(kept as running maxima, so the record itself does not grow).
usage: soak_worker.py STEPS WARM NVME_DIR OUT"""
import array
import ctypes
import gc
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


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _Mallinfo2


def malloc_live_bytes():
    """Bytes malloc has handed out and not had back (glibc's mallinfo2: in-use chunks of
    every arena plus mmapped blocks): a leak raises it, a cache kept by the allocator
    (which RSS also shows) does not."""
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


def exact_counts(engine):
    """What must not move at all once warm: the ledger per tier/kind, threads, files."""
    row = {}
    for tier, t in engine.memory_report().items():
        row[f"{tier} peak"] = t["peak"]
        for kind, k in t["kinds"].items():
            row[f"{tier}/{kind}"] = k["current"]
            row[f"{tier}/{kind} peak"] = k["peak"]
    row["threads"] = len(os.listdir("/proc/self/task"))
    row["open file descriptors"] = len(os.listdir("/proc/self/fd"))
    return row


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


WIDTH, SUB_GROUP = 96, 125_000


def main():
    steps, warm, nvme, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    with open(os.path.join(ROOT, "configs", "demo_zero3_nvme.yaml")) as f:
        config = yaml.safe_load(f)
    config["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme
    config["scheduler"]["params"]["total_num_steps"] = steps
    # The demo's six blocks (as many units, gathers and hooks a step) at half its width:
    # a step's leaks are the same, its arithmetic a quarter (the soak took 210 s alone,
    # 377 s beside the other tests, at width 192). The sub-groups shrink with the width,
    # so each rank's Adam state still streams through NVMe as 3 sub-groups.
    config["zero_optimization"]["sub_group_size"] = SUB_GROUP
    data, chars, _ = demo.load_text()
    torch.manual_seed(0)
    seq = 64
    model = demo.Gpt(len(chars), WIDTH, 6, 6, seq)
    engine, _, _, _ = zeroshard.initialize(model=model, config=config)
    micro = engine.train_micro_batch_size_per_gpu()
    gen = torch.Generator().manual_seed(100 + engine.rank)
    # Typed arrays, not lists: a list would keep one new int object a step, which the
    # count of Python's blocks would show as a leak.
    rss, live, blocks = (array.array("q", bytes(8 * steps)) for _ in range(3))
    losses = array.array("d", bytes(8 * steps))
    at_warm, largest = {}, {}
    for step in range(steps):
        starts = torch.randint(len(data) - seq - 1, (micro,), generator=gen)
        batch = torch.stack([data[s:s + seq + 1] for s in starts])
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        losses[step] = loss.item()
        rss[step] = rss_bytes()
        live[step] = malloc_live_bytes()
        # Python's count after a full collection (52 ms, so every 10th step): between
        # collections it also holds garbage in cycles that the collector frees later.
        if step % 10 == 0:
            gc.collect()
            blocks[step] = sys.getallocatedblocks()
        else:
            blocks[step] = blocks[step - 1]
        row = exact_counts(engine)
        if step == warm:
            at_warm = row
        elif step > warm:
            largest = {k: max(v, largest.get(k, 0)) for k, v in row.items()}
    with open(f"{out}.rank{engine.rank}.json", "w") as f:
        json.dump({"rss": rss.tolist(), "malloc_live": live.tolist(),
                   "python_blocks": blocks.tolist(), "at_warm": at_warm, "largest": largest,
                   "losses": losses.tolist()}, f)


if __name__ == "__main__":
    main()
