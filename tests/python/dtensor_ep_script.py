"""One rank of test_expert_parallel.py's DTensor case: a small mixture of experts whose
grouped experts (w1, w2, w3 [E, ...], torchtitan's GroupedExperts) the script splits itself,
as torch-native expert parallelism does: each weight distributed with Shard(0) over the "ep"
dimension of a ("dp", "ep") mesh, the MoE layer sending every route to its expert's rank
(funcol's differentiable all-to-all) and the experts computing on their local tensors. The
mesh is given to zeroshard.initialize at each ZeRO stage (each rank its own sample), the last
stage's engine saved to OUT.ckpt and its whole state_dict to OUT.whole.pt; and the reference:
one process training the unsplit model on the ranks' samples as one batch.

usage: dtensor_ep_script.py OUT STAGES (comma-separated)"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import zeroshard

E, H, I, V, SEQ, K, STEPS, EP = 4, 16, 24, 32, 8, 2, 4, 2
WORLD = int(os.environ["WORLD_SIZE"])


class GroupedExperts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(E, I, H) * 0.2)
        self.w2 = torch.nn.Parameter(torch.randn(E, H, I) * 0.2)
        self.w3 = torch.nn.Parameter(torch.randn(E, I, H) * 0.2)

    def forward(self, chunks):
        """chunks: [(expert of this rank's, its rows)] -> each chunk's outputs."""
        w1, w2, w3 = (w.to_local() if isinstance(w, DTensor) else w
                      for w in (self.w1, self.w2, self.w3))
        return [(F.silu(rows @ w1[e].T) * (rows @ w3[e].T)) @ w2[e].T for e, rows in chunks]


class MoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(H, E, bias=False)
        self.experts = GroupedExperts()
        self.ep_group = None  # set where the experts are split (the script's own EP)

    def forward(self, x):
        weights, chosen = torch.softmax(self.router(x), dim=-1).topk(K, dim=-1)
        routes = chosen.reshape(-1)
        order = torch.argsort(routes, stable=True)
        rows, experts = x[order // K], routes[order]
        counts = torch.bincount(experts, minlength=E)
        if self.ep_group is None:
            outs = self.experts(list(enumerate(torch.split(rows, counts.tolist()))))
        else:
            outs = self.dispatched(rows, counts)
        out = torch.zeros_like(x).index_add(
            0, order // K, torch.cat(outs) * weights.reshape(-1)[order, None])
        return out

    def dispatched(self, rows, counts):
        """Each route to its expert's rank and back; the received rows come in chunks by
        source rank, then by this rank's experts."""
        local = E // EP
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.ep_group)  # [source, expert]
        sent = counts.view(EP, local).sum(1).tolist()
        got = received.view(EP, local).sum(1).tolist()
        rows = funcol.all_to_all_single_autograd(rows, got, sent, self.ep_group)
        sizes = received.tolist()
        chunks = list(zip([i % local for i in range(len(sizes))], torch.split(rows, sizes)))
        back = funcol.all_to_all_single_autograd(torch.cat(self.experts(chunks)), sent, got,
                                                 self.ep_group)
        return [back]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, H)
        self.moe = MoE()
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        return self.head(x + self.moe(x))


def loss_of(model, ids):
    return F.cross_entropy(model(ids[:-1]), ids[1:])


def samples():
    torch.manual_seed(3)
    return torch.randint(0, V, (STEPS, WORLD, SEQ))


def reference(ids):
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        opt.zero_grad()
        each = [loss_of(model, ids[step, r]) for r in range(WORLD)]
        (sum(each) / WORLD).backward()
        norms.append(torch.sqrt(sum((p.grad.double() ** 2).sum()
                                    for p in model.parameters())).item())
        opt.step()
        losses.append([loss.item() for loss in each])
    return losses, norms, {n: p.detach() for n, p in model.named_parameters()}


def split_experts(model, mesh):
    """The script's expert parallelism: Shard(0) of every expert weight over mesh['ep']."""
    experts = model.moe.experts
    for name in ("w1", "w2", "w3"):
        whole = getattr(experts, name)
        setattr(experts, name, torch.nn.Parameter(distribute_tensor(
            whole.detach(), mesh["ep"], [Shard(0)])))
    model.moe.ep_group = mesh["ep"].get_group()


def main():
    out, stages = sys.argv[1], sys.argv[2].split(",")
    ids = samples()
    ref_losses, ref_norms, ref_params = reference(ids)
    zeroshard.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (WORLD // EP, EP), mesh_dim_names=("dp", "ep"))
    result = {"ref_losses": ref_losses, "ref_norms": ref_norms}
    for stage in stages:
        model = Model()
        split_experts(model, mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        engine = zeroshard.initialize(model=model, optimizer=optimizer, mesh=mesh, config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": int(stage)}})[0]
        losses, norms = [], []
        for step in range(STEPS):
            loss = loss_of(engine, ids[step, rank])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            norms.append(float(engine.get_global_grad_norm()))
        whole = engine.state_dict()
        if stage == stages[-1]:  # its checkpoint, and the whole model to consolidate it to
            engine.save_checkpoint(f"{out}.ckpt")
            if rank == 0:
                torch.save(whole, f"{out}.whole.pt")
        result[f"stage{stage}"] = {
            "losses": losses, "norms": norms,
            "max_param_diff": max((whole[n] - p).abs().max().item()
                                  for n, p in ref_params.items()),
            "expert_shape": list(whole["moe.experts.w1"].shape),
            "local_shape": list(model.moe.experts._parameters["w1"].shape)}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
