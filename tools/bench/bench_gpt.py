"""The GPT of the C++ benchmarks (tools/bench/BenchGpt.h), in Python: the same modules in
the same order and the same arithmetic, so a peer trained on the same seed and data ends
at zeroshard's loss (`zs bench peers`, `zs bench hosts`), `zs bench capacity`'s DDP
baseline holds the same parameters as the C++ model it is compared with, and `zs bench
python` trains it under DDP and the Python package. examples/train_gpt.py keeps its own:
an example a user reads and copies whole."""


def gpt_classes(torch):
    """(Gpt, Block) over the caller's torch (imported late by callers that first set
    resource limits): Gpt(shape) with shape's vocab, dim, layers, heads and seq;
    forward(tokens) of seq + 1 tokens per row returns the mean next-token loss."""
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, 4 * dim)
            self.fc2 = nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, d = x.shape
            hd = d // self.heads
            q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
            split = lambda p: p.view(b, t, self.heads, hd).transpose(1, 2)
            scores = split(q) @ split(k).transpose(-2, -1) / hd**0.5
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, -1e4).softmax(-1)
            attended = (scores @ split(v)).transpose(1, 2).reshape(b, t, d)
            h = x + self.proj(attended)
            return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))

    class Gpt(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.s = s
            self.emb = nn.Embedding(s["vocab"], s["dim"])
            with torch.no_grad():
                self.emb.weight.normal_(0, 0.02)
            self.blocks = nn.ModuleList(Block(s["dim"], s["heads"]) for _ in range(s["layers"]))
            self.ln_f = nn.LayerNorm(s["dim"])

        def forward(self, tokens):
            inp, target = tokens[:, : self.s["seq"]], tokens[:, 1:]
            h = self.emb(inp)
            for block in self.blocks:
                h = block(h)
            logits = self.ln_f(h) @ self.emb.weight.t()  # tied head
            return F.cross_entropy(logits.reshape(-1, self.s["vocab"]), target.reshape(-1))

    return Gpt, Block
