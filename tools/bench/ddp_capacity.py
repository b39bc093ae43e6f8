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

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.h = h

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.h, d // self.h).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(a.vocab, a.dim)
            self.blocks = nn.ModuleList(Block(a.dim, a.heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(a.dim)

        def forward(self, tokens):
            x = self.emb(tokens[:, :-1])
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln_f(x) @ self.emb.weight.t()
            return nn.functional.cross_entropy(logits.reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 500))
    torch.set_num_threads(os.cpu_count())
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(Gpt())
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
