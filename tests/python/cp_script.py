"""One rank of test_sequence_parallel.py's context-parallel case: a transformers Llama (4
query heads, 2 key-value heads, sdpa) trained with torch's ring attention
(torch.distributed.tensor.experimental.context_parallel) over the "cp" dimension of a
("dp", "cp") mesh given to zeroshard.initialize, as torchtitan and the Trainer's cp path
lay it out: each data-parallel group trains one sample a step, its cp ranks holding the
load-balanced slices of it (input ids, position ids, labels shifted before slicing); each
rank's loss its tokens' loss sum over the sample's token count. At each given ZeRO stage
in the same ranks; and the reference: whole sequences in one process with torch's AdamW.

usage: cp_script.py OUT CP CASES (comma-separated stages, "3cpu": stage 3 offloaded)"""
import json
import os
import sys
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

import zeroshard
from counted_collectives import Counted
from long_sequence_reference import (LR, SEQ, STEPS, make_model, reference, samples,
                                     zero_config)

OUT, CP, CASES = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
DP = int(os.environ["WORLD_SIZE"]) // CP
IDS = samples(STEPS * DP)


ref_losses, ref_norms, ref_params = reference(
    IDS, lambda step: range(step * DP, (step + 1) * DP))
zeroshard.init_distributed(dist_backend="gloo")
mesh = init_device_mesh("cpu", (DP, CP), mesh_dim_names=("dp", "cp"))
result = {"ref_losses": ref_losses, "ref_norms": ref_norms}
for case in CASES:
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero_config(case),
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}
    engine = zeroshard.initialize(model=make_model(), config=config, mesh=mesh)[0]
    losses, norms, positions = [], [], []
    for step in range(STEPS):
        ids = IDS[step * DP + engine.data_parallel_rank][None].clone()
        shift_labels = F.pad(ids, (0, 1), value=-100)[:, 1:].contiguous()
        tokens = (shift_labels != -100).sum()  # the sample's, counted before slicing
        position_ids = torch.arange(SEQ)[None]
        buffers = [ids, position_ids, shift_labels]
        # The first step's ring rotations (forward and backward), what each rank puts in.
        counted = Counted("all_gather_tensor", "permute_tensor") if step == 0 else None
        with context_parallel(mesh["cp"], buffers=buffers, buffer_seq_dims=[1, 1, 1],
                              no_restore_buffers=set(buffers)), counted or nullcontext():
            logits = engine(input_ids=ids, position_ids=position_ids).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), shift_labels.flatten(),
                                   ignore_index=-100, reduction="sum") / tokens
            engine.backward(loss)
        if counted is not None:
            exchanged = counted.bytes
        engine.step()
        losses.append(loss.item())
        norms.append(float(engine.get_global_grad_norm()))
        positions.append(position_ids[0].tolist())
    with zeroshard.zero.GatheredParameters(list(engine.module.parameters())):
        max_param_diff = max((p.detach() - ref_params[n].detach()).abs().max().item()
                             for n, p in engine.module.named_parameters())
    result[f"stage{case}"] = {
        "losses": losses, "norms": norms, "positions": positions, "max_param_diff": max_param_diff,
        "dp_world_size": engine.dp_world_size, "seq_dp_world_size": engine.seq_dp_world_size,
        "train_batch_size": engine.train_batch_size(), "exchanged_bytes": exchanged}
with open(f"{OUT}.rank{torch.distributed.get_rank()}.json", "w") as f:
    json.dump(result, f)
