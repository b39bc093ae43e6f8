"""One rank of test_accelerate.py's context-parallel case: the loop accelerate's ND-parallel
example writes (ParallelismConfig(dp_shard_size=2, cp_size=2), prepare(model, optimizer,
loader), maybe_context_parallel over the batch's buffers, the model's own loss,
accelerator.backward) with zeroshard's Accelerator at ZeRO 3; and the reference, first, on
the same ranks: what accelerate's FSDP2 path runs (it takes no CPU ranks itself): fully_shard
over accelerate's own dp_shard_cp mesh, torch's context_parallel over its cp mesh, the same
samples, torch's AdamW.

usage: accelerate_cp_script.py OUT"""
import json
import sys

import torch
import torch.nn.functional as F
from accelerate import ParallelismConfig
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.experimental import context_parallel

from long_sequence_reference import LR, SEQ, STEPS, make_model, samples
from zeroshard._sequence.context_parallel import enable_cpu_ring_attention
from zeroshard.integrations import Accelerator

DP, CP = 2, 2
IDS = samples(STEPS * DP)


def collate(rows):
    ids = torch.stack(rows)
    return {"input_ids": ids, "labels": ids, "position_ids": torch.arange(SEQ)[None],
            "shift_labels": F.pad(ids, (0, 1), value=-100)[:, 1:].contiguous()}


def train_step(model, batch, cp_context, backward):
    """The example's step: every buffer sliced along the sequence, the model's loss (this
    rank's slice's mean), backward inside the context."""
    buffers = [batch[k] for k in ("input_ids", "labels", "shift_labels", "position_ids")]
    with cp_context(buffers=buffers, buffer_seq_dims=[1] * 4, no_restore_buffers=set(buffers)):
        loss = model(**batch).loss
        backward(loss)
    return loss.item(), batch["position_ids"][0].tolist()


def fsdp2(mesh):
    """accelerate's FSDP2 path by hand: each rank's batch its dp coordinate's sample. torch's
    ring dispatches CUDA kernels only: the engine's rule for sdpa's CPU kernel is installed."""
    enable_cpu_ring_attention()
    model = make_model()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp_shard_cp"])
    fully_shard(model, mesh=mesh["dp_shard_cp"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    context = lambda **kw: context_parallel(mesh["cp"], **kw)  # noqa: E731
    for step in range(STEPS):
        batch = collate([IDS[step * DP + mesh.get_local_rank("dp_shard")]])
        losses.append(train_step(model, batch, context, lambda loss: loss.backward())[0])
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).full_tensor().item())
        opt.step()
        opt.zero_grad()
    return losses, norms, {n: p.full_tensor().detach() for n, p in model.named_parameters()}


pc = ParallelismConfig(dp_shard_size=DP, cp_size=CP)
accelerator = Accelerator(cpu=True, parallelism_config=pc, zeroshard_config={
    "zero_optimization": {"stage": 3}, "gradient_clipping": 0.0})
ref_losses, ref_norms, ref_params = fsdp2(accelerator.torch_device_mesh)
model = make_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
loader = torch.utils.data.DataLoader(list(IDS), batch_size=1, collate_fn=collate)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses, norms, firsts, positions = [], [], [], []
for batch in loader:
    firsts.append(batch["input_ids"][0, :4].tolist())
    loss, position_ids = train_step(model, batch, accelerator.maybe_context_parallel,
                                    accelerator.backward)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss)
    positions.append(position_ids)
    norms.append(float(accelerator.zeroshard_engine.get_global_grad_norm()))
engine = accelerator.zeroshard_engine
params = {n: p.detach() for n, p in engine.state_dict().items()}
result = {"losses": losses, "norms": norms, "ref_losses": ref_losses, "ref_norms": ref_norms,
          "firsts": firsts, "positions": positions,
          "max_param_diff": max((params[n] - p).abs().max().item()
                                for n, p in ref_params.items()),
          "dp_world_size": engine.dp_world_size, "seq_dp_world_size": engine.seq_dp_world_size}
with open(f"{sys.argv[1]}.rank{accelerator.process_index}.json", "w") as f:
    json.dump(result, f)
