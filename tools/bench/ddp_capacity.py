"""The baseline of `zs bench capacity`: the largest GPT-style model (the same family as
the C++ benchmark's: d, heads, vocab, 12 d^2 + 13 d per block, tied head) that torch
DDP (gloo, one rank) with torch.optim.AdamW can take one training step of, fp32, under
the given address-space limit. Sizes grow until a step fails; each attempt runs in its
own process. Prints progress to stderr and one JSON object on stdout."""
import argparse
import json
import os
import resource
import subprocess
import sys


def attempt(a, layers):
    resource.setrlimit(resource.RLIMIT_AS, (a.address_limit, a.address_limit))
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from bench_gpt import gpt_classes

    Gpt, _ = gpt_classes(torch)
    shape = dict(vocab=a.vocab, dim=a.dim, layers=layers, heads=a.heads, seq=a.seq)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 500))
    torch.set_num_threads(os.cpu_count())
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(Gpt(shape))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    tokens = torch.randint(a.vocab, (1, a.seq + 1))
    model(tokens).backward()
    opt.step()
    print(sum(p.numel() for p in model.parameters()))


def params_of(a, layers):
    return layers * (12 * a.dim * a.dim + 13 * a.dim) + a.vocab * a.dim + 2 * a.dim


def main():
    p = argparse.ArgumentParser()
    for k in ("dim", "heads", "vocab", "seq", "address_limit", "max_params"):
        p.add_argument("--" + k.replace("_", "-"), type=int, required=True)
    p.add_argument("--layers", type=int, default=0, help="internal: run one attempt")
    a = p.parse_args()
    if a.layers:
        attempt(a, a.layers)
        return
    largest, tried, layers = 0, [], 2
    while params_of(a, layers) <= a.max_params:
        cmd = [sys.executable, __file__] + sys.argv[1:] + ["--layers", str(layers)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        ok = r.returncode == 0
        n = params_of(a, layers)
        tried.append({"params": n, "ok": ok})
        tail = "" if ok else " (" + (r.stderr.strip().splitlines() or ["killed"])[-1][:160] + ")"
        print(f"  DDP {n / 1e9:.3f}B: {'steps' if ok else 'fails'}{tail}", file=sys.stderr)
        if not ok:
            break
        largest = n
        layers += 2
    print(json.dumps({"largest_params": largest, "tried": tried}))


if __name__ == "__main__":
    main()
