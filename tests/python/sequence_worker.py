"""One rank of test_sequence_parallel.py. Every rank makes the same whole sequences (one
seed) and keeps its slice; the reference is the same computation on the whole sequence in
one process, run here on every rank.

usage: sequence_worker.py OUT MODE PACKAGE
  MODE attention-LAYOUT (LAYOUT: batch, seq, gqa, rotary; uneven (3 heads) and fewkv (1
    key-value head) are refused): DistributedAttention around
    torch's sdpa (causal); writes this rank's output and its q, k, v gradients, and the
    whole sequence's in one process.
  MODE train-STAGE: a small causal transformer whose attention is DistributedAttention,
    trained 3 steps with ZeRO STAGE, every rank a data-parallel rank (no sequence-parallel
    key): each rank's loss is its slice's mean, which the engine averages; writes the losses
    and the parameters, and the same model trained on whole sequences with torch's AdamW in
    one process.
  MODE sp-STAGE: the same with the config's sequence_parallel_size and an mpu of Ulysses'
    groups (sequence_parallel_case says how the batch and the gradients count).
  PACKAGE: zeroshard, or deepspeed (DeepSpeed's DistributedAttention; its engine in sp)."""
import importlib
import json
import sys

import torch
import torch.nn.functional as F

import devices
from rank_result import leave

OUT, MODE, PACKAGE = sys.argv[1], sys.argv[2], sys.argv[3]
B, S, HEADS, KV_HEADS, DIM = 2, 8, 4, 2, 8

if PACKAGE == "deepspeed":
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
else:
    import zeroshard
    zeroshard.init_distributed()
import torch.distributed as dist  # noqa: E402

layer = importlib.import_module(f"{PACKAGE}.sequence.layer")
RANK, WORLD = dist.get_rank(), dist.get_world_size()


def local_attention(q, k, v, batch_dim_idx=0):
    """Causal sdpa on [b, s, h, d] (or [s, b, h, d]); key-value heads repeated for GQA."""
    if batch_dim_idx == 1:
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    return out.transpose(0, 1) if batch_dim_idx == 1 else out


def rotary(seq, dim):
    """cos, sin of shape [s, 1, 1, dim], as Megatron's rotary embedding gives them."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.outer(torch.arange(seq).float(), inv)
    emb = torch.cat((angles, angles), dim=-1)[:, None, None, :]
    return emb.cos(), emb.sin()


def rotate(t, cos, sin):
    first, second = t.chunk(2, dim=-1)
    return t * cos + torch.cat((-second, first), dim=-1) * sin


def attention_case(layout):
    batch_dim = 1 if layout == "seq" else 0
    heads = 3 if layout == "uneven" else HEADS  # uneven, fewkv: refused
    kv = {"gqa": KV_HEADS, "fewkv": 1}.get(layout, heads)
    g = torch.Generator().manual_seed(7)

    def whole(heads):
        shape = (S, B, heads, DIM) if batch_dim == 1 else (B, S, heads, DIM)
        return torch.randn(shape, generator=g)

    q, k, v = whole(heads), whole(kv), whole(kv)
    grad_out = whole(heads)
    seq_dim = 1 - batch_dim
    mine = slice(RANK * S // WORLD, (RANK + 1) * S // WORLD)

    def slice_of(t):
        return t.narrow(seq_dim, mine.start, mine.stop - mine.start)

    # Reference: the whole sequence in this process.
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    rq, rk = ref_in[0], ref_in[1]
    if layout == "rotary":
        cos, sin = (x.transpose(0, 1) for x in rotary(S, DIM))  # [1, s, 1, d]: batch first
        rq, rk = rotate(rq, cos, sin), rotate(rk, cos, sin)
    ref = local_attention(rq, rk, ref_in[2], batch_dim)
    ref.backward(grad_out)

    inputs = [slice_of(t).clone().requires_grad_() for t in (q, k, v)]
    attn = layer.DistributedAttention(lambda a, b, c: local_attention(a, b, c, batch_dim),
                                      dist.group.WORLD)
    extra = {"rotary_pos_emb": rotary(S, DIM)} if layout == "rotary" else {}
    out = attn(*inputs, batch_dim, **extra)
    out.backward(slice_of(grad_out))
    return {"out": out.tolist(), "ref_out": slice_of(ref).tolist(),
            "grads": [t.grad.tolist() for t in inputs],
            "ref_grads": [slice_of(t.grad).tolist() for t in ref_in]}


class Model(torch.nn.Module):
    VOCAB, WIDTH = 32, HEADS * DIM

    def __init__(self, attention):
        super().__init__()
        self.embed = torch.nn.Embedding(self.VOCAB, self.WIDTH)
        # No bias: a key's bias moves every score of a query alike, so its gradient is zero
        # but for rounding, which Adam would scale up to whole steps of noise.
        self.qkv = torch.nn.Linear(self.WIDTH, 3 * self.WIDTH, bias=False)
        self.proj = torch.nn.Linear(self.WIDTH, self.WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(self.WIDTH, 2 * self.WIDTH),
                                       torch.nn.GELU(),
                                       torch.nn.Linear(2 * self.WIDTH, self.WIDTH))
        self.head = torch.nn.Linear(self.WIDTH, self.VOCAB)
        self.attention = attention

    def forward(self, ids, labels, tokens_in_group=None):
        """The mean loss over this rank's tokens; with tokens_in_group, this rank's share of
        the group's mean (its tokens' sum over the group's count), which the engine sums."""
        x = self.embed(ids)  # [b, s_local, width]
        q, k, v = (t.unflatten(-1, (HEADS, DIM)) for t in self.qkv(x).chunk(3, dim=-1))
        x = x + self.proj(self.attention(q, k, v, 0).flatten(-2))
        x = x + self.mlp(x)
        logits, labels = self.head(x).flatten(0, 1), labels.flatten()
        if tokens_in_group is None:
            return F.cross_entropy(logits, labels)
        return F.cross_entropy(logits, labels, reduction="sum") / tokens_in_group


def train_case(stage):
    torch.manual_seed(0)
    tokens = torch.randint(0, Model.VOCAB, (3, B, S + 1)).to(devices.device())
    # Labels shifted before the sequence is sliced: each rank's last label is the first
    # token of the next rank's slice.
    mine = slice(RANK * S // WORLD, (RANK + 1) * S // WORLD)

    ulysses = layer.DistributedAttention(local_attention, dist.group.WORLD)
    torch.manual_seed(1)
    engine, _, _, _ = zeroshard.initialize(
        model=Model(ulysses).to(tokens.device), config={
            "train_micro_batch_size_per_gpu": B, "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}}})
    losses = []
    for step in range(3):
        ids, labels = tokens[step, :, :-1], tokens[step, :, 1:]
        loss = engine(ids[:, mine], labels[:, mine])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with zeroshard.zero.GatheredParameters(list(engine.module.parameters())):
        params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}

    ref_losses, ref_params = reference(tokens, 3)
    diff = max((params[n] - p.detach()).abs().max().item() for n, p in ref_params.items())
    return {"losses": losses, "ref_losses": ref_losses, "max_param_diff": diff}


def reference(tokens, steps):
    """The model on whole sequences in one process, torch's AdamW: losses, parameters."""
    torch.manual_seed(1)
    ref = Model(local_attention).to(tokens.device)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.0)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = ref(tokens[step, :, :-1], tokens[step, :, 1:])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, dict(ref.named_parameters())


def sequence_parallel_case(stage):
    """The config's sequence_parallel_size and an mpu of Ulysses' groups, as ALST passes
    them: a batch counts the group's ranks once (train_batch_size 2B over micro-batches of
    B: 2 accumulation steps), and the group's gradients are summed, so each rank's loss is
    its share of the group's mean."""
    package = importlib.import_module(PACKAGE)
    state = importlib.import_module(f"{PACKAGE}.runtime.sequence_parallel.parallel_state_sp")
    state.initialize_sequence_parallel(WORLD)
    torch.manual_seed(0)
    steps, accumulation = 2, 2
    tokens = torch.randint(0, Model.VOCAB, (steps, accumulation * B, S + 1)).to(devices.device())
    mine = slice(RANK * S // WORLD, (RANK + 1) * S // WORLD)
    torch.manual_seed(1)
    model = Model(layer.DistributedAttention(local_attention,
                                             state.get_sequence_parallel_group())).to(tokens.device)
    engine, _, _, _ = package.initialize(
        model=model, model_parameters=model.parameters(), mpu=state, config={
            "train_batch_size": accumulation * B, "train_micro_batch_size_per_gpu": B,
            "sequence_parallel_size": WORLD, "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}}})
    losses = []
    for step in range(steps):
        for micro in range(accumulation):
            rows = slice(micro * B, (micro + 1) * B)
            ids, labels = tokens[step, rows, :-1], tokens[step, rows, 1:]
            loss = engine(ids[:, mine], labels[:, mine], tokens_in_group=B * S)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    names = [n for n, _ in engine.module.named_parameters()]
    with package.zero.GatheredParameters(list(engine.module.parameters())):
        params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    ref_losses, ref_params = reference(tokens, steps)
    diffs = {n: (params[n] - ref_params[n].detach()).abs().max().item() for n in names}
    result = {"losses": losses, "ref_losses": ref_losses, "param_diffs": diffs,
              "max_param_diff": max(diffs.values()),
              "gradient_accumulation_steps": engine.gradient_accumulation_steps()}
    if PACKAGE == "zeroshard":
        loader = engine.deepspeed_io(torch.utils.data.TensorDataset(torch.arange(8)))
        result.update(samples=[b[0].tolist() for b in loader],
                      dp_world_size=engine.dp_world_size,
                      seq_dp_world_size=engine.seq_dp_world_size,
                      train_batch_size=engine.train_batch_size(),
                      group_size=dist.get_world_size(engine.seq_parallel_group))
    return result


kind, arg = MODE.split("-", 1)
result = {"attention": attention_case, "train": train_case,
          "sp": sequence_parallel_case}[kind](arg if kind == "attention" else int(arg))
if PACKAGE == "deepspeed":
    leave(OUT, result)  # rank_result.py says why
with open(f"{OUT}.rank{RANK}.json", "w") as f:
    json.dump(result, f)
