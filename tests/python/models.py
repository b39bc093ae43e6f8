"""Models the Python tests train, shared by the DDP reference and the zeroshard ranks."""
import torch
import torch.nn as nn

VOCAB, DIM, SEQ = 64, 32, 16


class Block(nn.Module):
    def __init__(self, dim=DIM):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.ln(x))))


class TinyGpt(nn.Module):
    """Token embedding tied to the output head, a stack of blocks."""

    def __init__(self, layers=3, dim=DIM):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, tokens):
        x = self.emb(tokens[:, :-1])
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.emb.weight.t()
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


class HfStyle(nn.Module):
    """What Hugging Face models do: tied input/output embeddings, a frozen module, a
    module used twice per forward, and a module skipped on some steps (data-dependent)."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(SEQ, DIM)
        self.position.weight.requires_grad_(False)  # frozen
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.shared = Block()  # used twice
        self.optional = Block()  # skipped when the batch's first token is even
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied

    def forward(self, tokens):
        inp = tokens[:, :-1]
        x = self.embed_tokens(inp) + self.position(torch.arange(inp.shape[1], device=tokens.device))
        x = self.shared(x)
        for layer in self.layers:
            x = layer(x)
        x = self.shared(x)
        if int(tokens[0, 0]) % 2 == 1:
            x = self.optional(x)
        logits = self.lm_head(self.norm(x))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


class CheckpointedGpt(TinyGpt):
    """TinyGpt whose blocks are recomputed in backward (torch.utils.checkpoint), as Hugging
    Face's gradient_checkpointing_enable() does: the first block reentrant, the others not."""

    def forward(self, tokens):
        from torch.utils.checkpoint import checkpoint
        x = self.emb(tokens[:, :-1])
        for i, b in enumerate(self.blocks):
            x = checkpoint(b, x, use_reentrant=i == 0)
        logits = self.ln_f(x) @ self.emb.weight.t()
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def make(name):
    torch.manual_seed(1234)
    return {"gpt": TinyGpt, "hf": HfStyle, "wide": _wide, "ckpt": CheckpointedGpt}[name]()


def _wide():
    """0.8M parameters, where what collectives carry outweighs their overhead on the wire
    (the hosts tests count link bytes). The embedding starts at std 0.1 so the tied head's
    logits start near unit variance (N(0, 1) gave losses near 30, where fp32 sums in
    another order part by more than 1e-5) and the loss still has room to fall."""
    model = TinyGpt(dim=256)
    with torch.no_grad():
        model.emb.weight.normal_(0, 0.1)
    return model


def units_of(name, model):
    if name == "hf":
        return list(model.layers) + [model.shared, model.optional]
    return None  # the default: every stack's blocks, and units for what is left


GLOBAL_ROWS = 8


def batch(step, rank, world):
    """Rank `rank`'s slice of step `step`'s global batch (the same 8 rows whatever the
    world size, so runs at different world sizes train on the same data); the first
    token (it decides the optional branch) is the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(VOCAB, (GLOBAL_ROWS, SEQ + 1), generator=g)
    tokens[:, 0] = tokens[0, 0]
    rows = GLOBAL_ROWS // world
    return tokens[rank * rows:(rank + 1) * rows]
