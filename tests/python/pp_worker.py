"""One rank of the pipeline-parallel tests: a small GPT split into two stages (the embedding
and the first blocks; the last blocks, the final norm and the head), each stage's module
handed to zeroshard.initialize with pipeline.stages 2 and run by torch's pipelining schedule
through zeroshard.pipelining.PipelineStage on PP x DP ranks (rank // DP is the stage); or
(mode ref) the whole model in one process with torch.optim.AdamW and torch's
clip_grad_norm_, on every data-parallel rank's batch at once. Both start from the same
weights (seed 0) and write OUT.rankN.json: per-step losses (the last stage's mean over its
micro-batches), pre-clip gradient norms, and the stage's parameters at the end under the
whole model's names.
usage: pp_worker.py ref|gpipe|1f1b STEPS OUT [CONFIG_JSON]"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, SEQ, LAYERS = 64, 32, 4, 12, 4
MICRO, MICROBATCHES, DP, STAGES = 2, 4, 2, 2
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 0.05


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        # No qkv bias: a key's bias has a true gradient of zero (softmax ignores a shift
        # shared by every key), and Adam turns the rounding left in its place into steps
        # of the lr's size that differ between any two summation orders.
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, DIM))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class FirstStage(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.emb = gpt.emb
        self.blocks = nn.ModuleList(gpt.blocks[:LAYERS // 2])

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return x


class LastStage(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.blocks = nn.ModuleList(gpt.blocks[LAYERS // 2:])
        self.norm, self.head = gpt.norm, gpt.head

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def whole_name(stage, name):
    """A stage's parameter name as the whole GPT names it."""
    if stage == 1 and name.startswith("blocks."):
        index, rest = name[len("blocks."):].split(".", 1)
        return f"blocks.{int(index) + LAYERS // 2}.{rest}"
    return name


def gpt():
    torch.manual_seed(0)
    model = GPT()
    for name, p in model.named_parameters():
        if p.dim() == 2 and not name.startswith("emb"):
            nn.init.normal_(p, std=0.2)
        elif name.endswith("bias"):
            nn.init.uniform_(p, -0.1, 0.1)
    return model


def batch(step, dp_rank):
    """Rank dp_rank's batch of a step (all its micro-batches); the reference joins them."""
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    return torch.randint(0, VOCAB, (MICRO * MICROBATCHES, SEQ + 1), generator=g)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def reference(steps):
    model = gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses, norms = [], []
    for step in range(steps):
        tokens = torch.cat([batch(step, r) for r in range(DP)])
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms,
            "params": {n: p.detach().tolist() for n, p in model.named_parameters()}}


def trained(mode, steps, config):
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    import zeroshard
    from zeroshard.pipelining import PipelineStage

    rank = int(os.environ["RANK"])
    stage_index, dp_rank = rank // DP, rank % DP
    whole = gpt()
    module = FirstStage(whole) if stage_index == 0 else LastStage(whole)
    config = dict(config, train_micro_batch_size_per_gpu=MICRO,
                  gradient_accumulation_steps=MICROBATCHES, gradient_clipping=CLIP,
                  pipeline={"stages": STAGES},
                  optimizer={"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS),
                                                         "eps": EPS, "weight_decay": WD}})
    engine, _, _, _ = zeroshard.initialize(model=module, config=config)
    stage = PipelineStage(engine)
    schedule = (ScheduleGPipe if mode == "gpipe" else Schedule1F1B)(
        stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    losses, norms = [], []
    for step in range(steps):
        tokens = batch(step, dp_rank)
        micro_losses = []
        if stage_index == 0:
            schedule.step(tokens[:, :-1].contiguous())
        else:
            schedule.step(target=tokens[:, 1:].contiguous(), losses=micro_losses)
        engine.step()
        norms.append(engine.get_global_grad_norm())
        if micro_losses:
            losses.append(sum(float(l) for l in micro_losses) / len(micro_losses))
    sent = engine._engine.bytes_sent()  # before the gather below
    model = engine.module
    with zeroshard.zero.GatheredParameters(list(model.parameters())):
        params = {whole_name(stage_index, n): p.detach().tolist()
                  for n, p in model.named_parameters()}
    dist.barrier()
    report = engine.memory_report()["device"]["kinds"]["params"]
    return {"losses": losses, "norms": norms, "params": params, "stage": stage_index,
            "bytes_sent": sent, "params_peak": report["peak"],
            "dp_world_size": engine.dp_world_size, "train_batch_size": engine.train_batch_size()}


def main():
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    if mode == "ref":
        result = reference(steps)
    else:
        result = trained(mode, steps, json.loads(sys.argv[4]))
    with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
