"""One rank of the tensor-parallel tests: a Megatron-style GPT written as a user writes one
(column-parallel q, k, v and fc1, row-parallel o and fc2, the tp all-reduces in autograd
functions of its own, parameters marked tensor_model_parallel with partition_dim), trained
by zeroshard through initialize(mpu=...) on TP x DP ranks; or (mode ref) the same model
unsplit in one process with torch.optim.AdamW and torch's clip_grad_norm_, on the batch of
every data-parallel rank. Both start from the same full weights (seed 0) and write
OUT.rankN.json: per-step losses, pre-clip gradient norms, and the parameters at the end
(each rank its own slices; the test joins them).
Mode dtensor: the unsplit model split by torch's parallelize_module over a (dp, tp) device
mesh instead, handed over with initialize(mesh=...). Mode hf: a transformers Llama that
zeroshard splits by its own tp_plan (tensor_parallel.autotp_size in the config); hfref: the
same Llama unsplit in one process.
Mode sp: dtensor's with sequence parallelism (torchtitan's whole plan).
usage: tp_worker.py ref|hfref|zs|dtensor|sp|hf TP STEPS OUT [CONFIG_JSON]
ZS_CKPT_DIR and ZS_CKPT_SAVE_AT=N: save there after step N and stop; ZS_CKPT_LOAD=DIR: load
the latest checkpoint there first and train on from its step. ZS_TP_SKEW=1: each rank takes
the batch of its global rank, so tp peers differ (which the engine must refuse)."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import devices  # noqa: E402

VOCAB, DIM, HEADS, SEQ, LAYERS = 64, 32, 4, 12, 2
MICRO, ACCUMULATION, DP = 2, 2, 2
# Adam turns the rounding of near-zero gradients into steps of the lr's order: at lr 1e-2 the
# one-process fp32 run itself ends 1.7e-5 (of a tensor's scale) from the same run in fp64;
# at 1e-3, 1.7e-6 (and a TP2 x DP2 run on LibTorch 2.6 ended 1.09e-5 off at 2e-3), so a 1e-5
# comparison of the parameters tests the arithmetic, not rounding.
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 0.05


class _CopyToTp(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity, gradients summed."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        if ctx.group is not None:
            dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTp(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: summed, gradients as they are."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        if group is not None:
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _mark(param, dim):
    param.tensor_model_parallel = True
    param.partition_dim = dim
    return param


class ColumnParallelLinear(nn.Module):
    def __init__(self, d_in, d_out, tp, group, bias=True):
        super().__init__()
        self.group = group
        self.weight = _mark(nn.Parameter(torch.empty(d_out // tp, d_in)), 0)
        self.bias = _mark(nn.Parameter(torch.zeros(d_out // tp)), 0) if bias else None

    def forward(self, x):
        return F.linear(_CopyToTp.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, d_in, d_out, tp, group):
        super().__init__()
        self.group = group
        self.weight = _mark(nn.Parameter(torch.empty(d_out, d_in // tp)), 1)
        self.bias = nn.Parameter(torch.zeros(d_out))  # added once, after the sum: whole

    def forward(self, x):
        return _ReduceFromTp.apply(F.linear(x, self.weight), self.group) + self.bias


def column(d_in, d_out, tp, group, bias=True):
    """Split by the model itself (Megatron's way) where it is given a tp group; else a plain
    nn.Linear, which the unsplit reference runs and torch's parallelize_module splits."""
    if group is None:
        return nn.Linear(d_in, d_out, bias=bias)
    return ColumnParallelLinear(d_in, d_out, tp, group, bias)


def row(d_in, d_out, tp, group):
    return nn.Linear(d_in, d_out) if group is None else RowParallelLinear(d_in, d_out, tp, group)


class Block(nn.Module):
    def __init__(self, tp, group):
        super().__init__()
        self.heads = HEADS // tp
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        # No bias on q, k, v (as Llama): a key bias's gradient is zero but for rounding, which
        # Adam would turn into steps of full size.
        self.q, self.k, self.v = (column(DIM, DIM, tp, group, bias=False) for _ in range(3))
        self.o = row(DIM, DIM, tp, group)
        self.fc1 = column(DIM, 4 * DIM, tp, group)
        self.fc2 = row(4 * DIM, DIM, tp, group)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = (m(h) for m in (self.q, self.k, self.v))
        b, s = q.shape[:2]  # the whole sequence (x holds a slice of it with sequence parallelism)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TpGpt(nn.Module):
    """tp 1 and group None: the unsplit model."""

    def __init__(self, tp=1, group=None):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(tp, group) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens[:, :-1])
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def initialized(model):
    """`model` with the tests' weights: matrices N(0, 0.2) (embeddings as built), biases
    U(-0.1, 0.1), drawn in parameter order from the seed the caller set."""
    for name, p in model.named_parameters():
        if p.dim() == 2 and not name.startswith("emb"):
            nn.init.normal_(p, std=0.2)
        elif name.endswith("bias"):
            nn.init.uniform_(p, -0.1, 0.1)
    return model


def full_model():
    torch.manual_seed(0)
    return initialized(TpGpt())


def load_slices(model, full, tp, tp_rank):
    """Each split parameter takes its tp rank's slice of the full one."""
    whole = dict(full.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            src = whole[name]
            if getattr(p, "tensor_model_parallel", False):
                src = src.chunk(tp, dim=p.partition_dim)[tp_rank]
            p.copy_(src)


def batch(step, micro, dp_rank):
    """Rank dp_rank's micro-batch of a step; the reference joins every rank's."""
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + dp_rank)
    return torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)


class Mpu:
    """Megatron's parallel_state as DeepSpeed reads it: consecutive ranks share a tp group."""

    def __init__(self, tp):
        rank, world = dist.get_rank(), dist.get_world_size()
        self.tp, self.rank, self.world = tp, rank, world
        for start in range(0, world, tp):
            g = dist.new_group(list(range(start, start + tp)))
            if start <= rank < start + tp:
                self.tp_group = g
        for t in range(tp):
            g = dist.new_group(list(range(t, world, tp)))
            if rank % tp == t:
                self.dp_group = g

    def get_tensor_model_parallel_world_size(self):
        return self.tp

    def get_tensor_model_parallel_rank(self):
        return self.rank % self.tp

    def get_tensor_model_parallel_group(self):
        return self.tp_group

    get_model_parallel_world_size = get_tensor_model_parallel_world_size
    get_model_parallel_rank = get_tensor_model_parallel_rank
    get_model_parallel_group = get_tensor_model_parallel_group

    def get_data_parallel_world_size(self):
        return self.world // self.tp

    def get_data_parallel_rank(self):
        return self.rank // self.tp

    def get_data_parallel_group(self):
        return self.dp_group


def llama():
    """A transformers Llama (its class carries a tp_plan), built from a config, seed 0."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=2 * DIM,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=2, max_position_embeddings=2 * SEQ)
    return LlamaForCausalLM(config)


def reference(steps, hf=False):
    dev = devices.device()
    model = (llama() if hf else full_model()).to(dev)
    if hf:
        model.forward_loss = lambda tokens: model(input_ids=tokens, labels=tokens).loss
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses, norms = [], []
    for step in range(steps):
        total = 0.0
        for micro in range(ACCUMULATION):
            tokens = torch.cat([batch(step, micro, r) for r in range(DP)]).to(dev)
            loss = model.forward_loss(tokens) if hf else model(tokens)
            (loss / ACCUMULATION).backward()
            total += loss.item() / ACCUMULATION
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return {"losses": losses, "norms": norms,
            "params": {n: p.detach().tolist() for n, p in model.named_parameters()}}


def parallelized(tp, sequence_parallel=False):
    """The unsplit model split by torch's parallelize_module over the "tp" dimension of a
    (dp, tp) mesh, as torchtitan splits a Llama: colwise q, k, v and fc1, rowwise o and fc2.
    With sequence_parallel, torchtitan's whole plan: the residual stream split along the
    sequence between blocks, the norms sequence-parallel, the embedding split by vocabulary
    (rowwise, its output a sequence slice), the head colwise from a sequence slice."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    dev = devices.device()  # (before the mesh: it sets the device itself otherwise)
    mesh = init_device_mesh(dev.type, (dist.get_world_size() // tp, tp),
                            mesh_dim_names=("dp", "tp"))
    model = full_model().to(dev)
    # With sequence parallelism a block's linears take a sequence slice and gather it
    # (colwise), or give one (rowwise: a reduce-scatter instead of an all-reduce).
    sliced = Shard(1) if sequence_parallel else Replicate()
    colwise = lambda: ColwiseParallel(input_layouts=sliced)  # noqa: E731
    rowwise = lambda: RowwiseParallel(output_layouts=sliced)  # noqa: E731
    for block in model.blocks:
        plan = {"q": colwise(), "k": colwise(), "v": colwise(),
                "o": rowwise(), "fc1": colwise(), "fc2": rowwise()}
        if sequence_parallel:
            plan.update(ln1=SequenceParallel(), ln2=SequenceParallel())
        parallelize_module(block, mesh["tp"], plan)
        block.heads = HEADS // tp  # each rank's share of the heads
    if sequence_parallel:
        parallelize_module(model, mesh["tp"], {
            "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "ln_f": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    return model, mesh


def trained(mode, tp, steps, config, out):
    import zeroshard
    dist.init_process_group("gloo")
    dev = devices.device()
    forward = None
    if mode in ("hf", "hf_mpu"):  # the Llama's own tp_plan, which zeroshard applies
        model = llama().to(dev)
        given = {}
        if mode == "hf_mpu":  # as DeepSpeed's AutoTP example: the script's mpu, its AdamW
            given = dict(mpu=Mpu(tp), optimizer=torch.optim.AdamW(
                model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD))
            config = {k: v for k, v in config.items() if k != "optimizer"}
        engine, *_ = zeroshard.initialize(model=model, config=config, **given)
        dp_rank = engine._engine.data_parallel_rank
        forward = lambda tokens: engine(input_ids=tokens, labels=tokens).loss  # noqa: E731
    elif mode in ("dtensor", "sp"):
        model, mesh = parallelized(tp, sequence_parallel=mode == "sp")
        engine, *_ = zeroshard.initialize(model=model, config=config, mesh=mesh)
        dp_rank = mesh.get_local_rank("dp")
    else:
        mpu = Mpu(tp)
        model = TpGpt(tp, mpu.tp_group)
        load_slices(model, full_model(), tp, mpu.get_tensor_model_parallel_rank())
        model.to(dev)
        engine, *_ = zeroshard.initialize(model=model, config=config, mpu=mpu)
        dp_rank = mpu.get_data_parallel_rank()
    if os.environ.get("ZS_TP_SKEW"):  # a loader split over every rank, tp peers too
        dp_rank = dist.get_rank()
    start, save_at = 0, int(os.environ.get("ZS_CKPT_SAVE_AT", "-1"))
    if os.environ.get("ZS_CKPT_LOAD"):
        engine.load_checkpoint(os.environ["ZS_CKPT_LOAD"])
        start = engine.global_steps
    losses, norms = [], []
    for step in range(start, steps):
        total = 0.0
        for micro in range(ACCUMULATION):
            tokens = batch(step, micro, dp_rank).to(dev)
            loss = forward(tokens) if forward else engine(tokens)
            engine.backward(loss)
            engine.step()
            total += loss.item() / ACCUMULATION
        norms.append(engine.get_global_grad_norm())
        losses.append(total)
        if step + 1 == save_at:
            engine.save_checkpoint(os.environ["ZS_CKPT_DIR"])
            break
    with zeroshard.zero.GatheredParameters(list(model.parameters())):
        params = {n: p.detach().tolist() for n, p in model.named_parameters()}
    split = {n: p.partition_dim for n, p in model.named_parameters()
             if getattr(p, "tensor_model_parallel", False)}
    report = engine.memory_report()
    memory = {tier: {kind: [k["current"], k["predicted"]] for kind, k in report[tier]["kinds"].items()}
              for tier in ("device", "host")}
    planned = None
    if mode == "hf" and dist.get_rank() == 0:  # the estimator on the unsplit model, tp given
        plan = zeroshard.estimate(llama(), config, gpus_per_node=dist.get_world_size(), tp=tp)
        planned = next(o["bytes_per_rank"] for o in plan["options"]
                       if o["option"] == f"stage {engine.zero_optimization_stage()}")
    return {"losses": losses, "norms": norms, "params": params, "split": split,
            "dp_world_size": engine.dp_world_size, "mp_world_size": engine.mp_world_size,
            "train_batch_size": engine.train_batch_size(), "memory": memory,
            "estimated": planned}


def main():
    mode, tp, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    if mode in ("ref", "hfref"):
        result = reference(steps, hf=mode == "hfref")
    else:
        result = trained(mode, tp, steps, json.loads(sys.argv[5]), out)
    with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
