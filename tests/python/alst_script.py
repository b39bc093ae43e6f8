"""One rank of test_sequence_parallel.py's ALST cases: DeepSpeed's ALST tutorial loop for a
Hugging Face model (register with transformers, the mpu to initialize, the data-loader
adapter, the loss of each slice gathered over the group and weighted by its tokens), its
package switched by one name, with engine.step() after each micro-batch, at each of the
given ZeRO stages in the same ranks; and the reference: the same model trained on whole
sequences in one process with torch's AdamW, each step's batch the samples the
data-parallel groups train in that step.

usage: alst_script.py OUT PACKAGE [SP [CASES [tiled]]]
  PACKAGE zeroshard or deepspeed; SP the sequence-parallel size (2; the rest of the world
  is data-parallel); CASES comma-separated ZeRO stages, "3cpu" for stage 3 with the
  optimizer and parameters offloaded to the CPU (2,3); tiled: the tutorial's tiled compute,
  each MLP in 4 tiles (TiledMLP patched into LlamaMLP.forward) and the logits with their
  loss in 2 (TiledFusedLogitsLoss over the base model's last hidden states)"""
import contextlib
import importlib
import json
import os
import sys

import torch

from counted_collectives import Counted
from rank_result import leave
from long_sequence_reference import (LR, SEQ, STEPS, make_model, reference, samples,
                                     zero_config)

OUT, PACKAGE = sys.argv[1], sys.argv[2]
SP = int(sys.argv[3]) if len(sys.argv) > 3 else 2
CASES = sys.argv[4].split(",") if len(sys.argv) > 4 else ["2", "3"]
TILED = len(sys.argv) > 5 and sys.argv[5] == "tiled"
deepspeed = importlib.import_module(PACKAGE)
ulysses_sp = importlib.import_module(f"{PACKAGE}.runtime.sequence_parallel.ulysses_sp")
groups = importlib.import_module(f"{PACKAGE}.utils.groups")
move_to_device = importlib.import_module(f"{PACKAGE}.runtime.utils").move_to_device
dist = importlib.import_module(f"{PACKAGE}.comm")

WORLD = int(os.environ["WORLD_SIZE"])
DP = WORLD // SP
IDS = samples(STEPS * DP)  # each group trains p samples per draw of the p ranks' loaders


def collate_fn(batch):
    (input_ids,) = batch[0]
    return dict(input_ids=input_ids.unsqueeze(0),
                position_ids=torch.arange(SEQ).unsqueeze(0), labels=input_ids.unsqueeze(0))


def tiled_mlp_forward(self, x):
    """The tutorial's patch of LlamaMLP.forward: the same tile count on every rank."""
    def mlp_forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    compute_params = [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight]
    return ulysses_sp.TiledMLP.apply(mlp_forward, self, x, 4, compute_params)


def tiled_loss_sum(model, batch):
    """The slice's loss summed over its tokens, its logits made two tiles at a time."""
    hidden = model.module.model(input_ids=batch["input_ids"],
                                position_ids=batch["position_ids"]).last_hidden_state
    vocab = model.module.config.vocab_size

    def loss_fn(lm_head, x, y):
        return torch.nn.functional.cross_entropy(lm_head(x).float().view(-1, vocab), y.view(-1),
                                                 ignore_index=-100, reduction="sum")
    head = model.module.lm_head
    return ulysses_sp.TiledFusedLogitsLoss.apply(loss_fn, head, hidden, batch["shift_labels"],
                                                 None, 2, [head.weight], "sum")


def step_samples(step):
    """The samples the data-parallel groups train in a step: each draw of the world's loaders
    (rank r's is sample draw * world + r) is p steps, the j-th taking each group's j-th
    rank's sample."""
    draw, j = divmod(step, SP)
    return [draw * WORLD + group * SP + j for group in range(DP)]


# (before registration: afterwards every sdpa model of this process attends through it)
ref_losses, ref_norms, ref_params = (reference(IDS, step_samples) if PACKAGE == "zeroshard"
                                      else ([], [], {}))
if TILED:  # after the reference, which runs the MLP whole
    from transformers.models.llama import modeling_llama
    modeling_llama.LlamaMLP.forward = tiled_mlp_forward
dist.init_distributed(dist_backend="gloo")
mpu = ulysses_sp.UlyssesSPAttentionHF.register_with_transformers(
    model_name_or_path=make_model(), core_attn_implementation="sdpa",
    sequence_parallel_size=SP, micro_batch_size=1, seq_length=SEQ, seq_length_is_variable=True)
result = {"ref_losses": ref_losses, "ref_norms": ref_norms}
for case in CASES:
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero_config(case),
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
              "sequence_parallel_size": SP}
    model = make_model()
    model, _, _, _ = deepspeed.initialize(config=config, model=model,
                                          model_parameters=model.parameters(), mpu=mpu)
    sp_group = groups._get_sequence_parallel_group()
    sp_world_size = groups._get_sequence_parallel_world_size()
    sp_rank = groups._get_sequence_parallel_rank()
    # Each rank draws its own samples, as a data-parallel rank would.
    ds = torch.utils.data.TensorDataset(IDS[dist.get_rank()::WORLD])
    dl = torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=collate_fn)
    dl = ulysses_sp.UlyssesSPDataLoaderAdapter(dl, sp_rank=sp_rank, sp_group=sp_group,
                                               sp_world_size=sp_world_size, device=model.device)
    losses, norms, batches = [], [], []
    # The first step's exchanges: the attention layers' all-to-alls in forward and backward
    # and their positions' all-gathers in forward (not the loss's gathers between them).
    forward_counted, backward_counted = Counted("all_to_all_single", "all_gather"), \
        Counted("all_to_all_single")
    for batch in dl:
        counting = not batches
        batches.append({k: v.tolist() for k, v in batch.items()})
        batch = move_to_device(batch, model.device)
        shift_labels = batch["shift_labels"]
        good_tokens = (shift_labels != -100).view(-1).sum()
        if TILED:
            loss = tiled_loss_sum(model, batch) / good_tokens  # the slice's mean, as below
        else:
            with forward_counted if counting else contextlib.nullcontext():
                outputs = model(**batch)
            loss = model.module.loss_function(logits=outputs.logits, labels=None,
                                              shift_labels=shift_labels,
                                              vocab_size=model.module.config.vocab_size)
        losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
        good_tokens_per_rank = torch.distributed.nn.functional.all_gather(good_tokens,
                                                                          group=sp_group)
        total_loss = sum(losses_per_rank[rank] * good_tokens_per_rank[rank]
                         for rank in range(sp_world_size))
        total_good_tokens = sum(good_tokens_per_rank)
        loss = total_loss / max(total_good_tokens, 1)
        with backward_counted if counting else contextlib.nullcontext():
            model.backward(loss)
        model.step()
        losses.append(loss.item())
        norms.append(float(model.get_global_grad_norm()))
    trained = {"losses": losses, "norms": norms, "batches": batches,
               "exchanged_bytes": forward_counted.bytes + backward_counted.bytes,
               "dp_world_size": model.dp_world_size, "seq_dp_world_size": model.seq_dp_world_size}
    if ref_params:
        with deepspeed.zero.GatheredParameters(list(model.module.parameters())):
            trained["max_param_diff"] = max(
                (p.detach() - ref_params[n].detach()).abs().max().item()
                for n, p in model.module.named_parameters())
    result[f"stage{case}"] = trained
if PACKAGE == "deepspeed":
    leave(OUT, result)  # rank_result.py says why
with open(f"{OUT}.rank{dist.get_rank()}.json", "w") as f:
    json.dump(result, f)
