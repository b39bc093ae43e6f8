"""A character-level GPT trained with zeroshard: the README's demo (./zs demo).

    ./zs run -n 2 examples/train_gpt.py --config configs/demo_zero3_nvme.yaml

Trains on the license texts every Debian machine has (/usr/share/common-licenses),
prints a progress line every --log-every steps (loss, tokens/s, learning rate, memory per
tier measured by the runtime beside the planner's prediction), and at the end writes a
plot of loss and memory per tier (--plot) and prints text the model generates."""
import argparse
import glob
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import zeroshard


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        x = x + self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2 does
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def load_text():
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    text = "".join(open(f, encoding="utf-8", errors="ignore").read() for f in files
                   if os.path.isfile(f))
    chars = sorted(set(text))
    return torch.tensor([chars.index(c) for c in text], dtype=torch.long), chars, len(files)


def tier_totals(report):
    """Per tier: (peak so far as the runtime measured it, the planner's prediction)."""
    return {tier: (t["peak"], t["predicted"]) for tier, t in report.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/demo_zero3_nvme.yaml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--plot", default="build/demo/train_gpt.png")
    a = p.parse_args()

    data, chars, nfiles = load_text()
    torch.manual_seed(0)
    model = Gpt(len(chars), a.dim, a.layers, a.heads, a.seq)
    engine, _, _, _ = zeroshard.initialize(model=model, config=a.config)
    main_rank = engine.rank == 0
    micro = engine.train_micro_batch_size_per_gpu()
    if main_rank:
        n = sum(p.numel() for p in set(model.parameters()))
        print(f"{len(data):,} characters of {nfiles} license texts, vocabulary {len(chars)}; "
              f"GPT {n / 1e6:.2f}M parameters ({a.layers} x d {a.dim}); {engine.plan} on "
              f"{engine.world_size} ranks; {micro} x {a.seq} tokens per rank per step", flush=True)
    gen = torch.Generator().manual_seed(100 + engine.rank)
    history = {"step": [], "loss": [], "memory": []}
    t0, tokens, last = time.time(), 0, time.time()
    for step in range(1, a.steps + 1):
        starts = torch.randint(len(data) - a.seq - 1, (micro,), generator=gen)
        batch = torch.stack([data[s:s + a.seq + 1] for s in starts])
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        tokens += micro * a.seq * engine.world_size
        history["step"].append(step)
        history["loss"].append(loss.item())
        history["memory"].append(tier_totals(engine.memory_report()))
        if main_rank and (step % a.log_every == 0 or step == 1):
            now = time.time()
            mem = "  ".join(f"{t} {c / 2**20:.1f}/{p / 2**20:.1f}"
                            for t, (c, p) in history["memory"][-1].items())
            print(f"step {step:4d}  loss {loss.item():.3f}  {tokens / (now - t0):7.0f} tok/s  "
                  f"lr {engine.get_lr()[0]:.2e}  MiB peak/planned: {mem}", flush=True)
    elapsed = time.time() - t0

    # Generation: every rank runs it (stage-3 gathers are collectives); rank 0 prints.
    engine.eval()
    idx = torch.tensor([[chars.index(c) for c in "The "]])
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _ in range(240):
            logits = engine(idx[:, -a.seq:])[:, -1] / 0.8
            idx = torch.cat([idx, torch.multinomial(logits.softmax(-1), 1, generator=g)], 1)
    if main_rank:
        first = sum(history["loss"][:10]) / 10
        final = sum(history["loss"][-10:]) / 10
        print(f"\n{a.steps} steps in {elapsed:.0f} s ({tokens / elapsed:.0f} tokens/s over "
              f"{engine.world_size} ranks); loss {first:.3f} -> {final:.3f} "
              f"(uniform guess: {math.log(len(chars)):.3f})")
        print("memory per tier on rank 0 (MiB, measured peak / planned):")
        for tier, (c, p) in history["memory"][-1].items():
            print(f"  {tier:6s} {c / 2**20:8.2f} / {p / 2**20:8.2f}")
        print("\nsample:\n" + "".join(chars[i] for i in idx[0].tolist()))
        plot(history, a.plot)


def plot(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(history["step"], history["loss"], lw=0.8)
    ax1.set(xlabel="step", ylabel="loss (rank 0)", title="training loss")
    for tier in history["memory"][0]:
        line, = ax2.plot(history["step"], [m[tier][0] / 2**20 for m in history["memory"]],
                         label=f"{tier} measured peak")
        ax2.plot(history["step"], [m[tier][1] / 2**20 for m in history["memory"]], ls="--",
                 color=line.get_color(), label=f"{tier} planned")
    ax2.set(xlabel="step", ylabel="MiB (rank 0)", title="memory per tier")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
