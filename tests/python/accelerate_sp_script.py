"""One rank of test_accelerate.py's sequence-parallel case: ALST's loop as accelerate's
sequence-parallelism guide writes it (ParallelismConfig(sp_backend="deepspeed", sp_size=2),
prepare(model, optimizer, loader), the loss of each slice gathered over the group and
weighted by its tokens, accelerator.backward), with zeroshard's Accelerator, at ZeRO 3;
and the reference: whole sequences in one process with torch's AdamW.

usage: accelerate_sp_script.py OUT"""
import json
import os
import sys

import torch
from accelerate import ParallelismConfig
from accelerate.utils import DeepSpeedSequenceParallelConfig

from long_sequence_reference import LR, SEQ, STEPS, make_model, reference, samples
from zeroshard.integrations import Accelerator
from zeroshard.utils import groups

SP = 2
WORLD = int(os.environ["WORLD_SIZE"])
DP = WORLD // SP
IDS = samples(STEPS * DP)


def step_samples(step):
    """accelerate's loader gives rank r the samples r, r + world, ...; each draw of the
    world's is sp steps, the j-th taking each group's j-th rank's sample."""
    draw, j = divmod(step, SP)
    return [draw * WORLD + group * SP + j for group in range(DP)]


def collate(rows):
    ids = torch.stack(rows)
    return {"input_ids": ids, "labels": ids, "position_ids": torch.arange(SEQ)[None]}


ref_losses, ref_norms, ref_params = reference(IDS, step_samples)  # before registration
handler = DeepSpeedSequenceParallelConfig(sp_seq_length=SEQ, sp_seq_length_is_variable=True,
                                          sp_attn_implementation="sdpa")
pc = ParallelismConfig(sp_backend="deepspeed", sp_size=SP, sp_handler=handler)
accelerator = Accelerator(cpu=True, parallelism_config=pc, zeroshard_config={
    "zero_optimization": {"stage": 3}, "gradient_clipping": 0.0})
model = make_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
loader = torch.utils.data.DataLoader(list(IDS), batch_size=1, collate_fn=collate)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
sp_group = groups._get_sequence_parallel_group()
losses, norms = [], []
for batch in loader:
    outputs = model(**batch)
    shift_labels = batch["shift_labels"]
    loss = accelerator.unwrap_model(model).loss_function(
        logits=outputs.logits, labels=None, shift_labels=shift_labels,
        vocab_size=accelerator.unwrap_model(model).config.vocab_size)
    losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
    good_tokens = (shift_labels != -100).view(-1).sum()
    good_tokens_per_rank = torch.distributed.nn.functional.all_gather(good_tokens, group=sp_group)
    loss = sum(losses_per_rank[r] * good_tokens_per_rank[r] for r in range(SP)) / max(
        sum(good_tokens_per_rank), 1)
    accelerator.backward(loss)
    optimizer.step()
    losses.append(loss.item())
    norms.append(float(accelerator.zeroshard_engine.get_global_grad_norm()))
engine = accelerator.zeroshard_engine
params = {n: p.detach() for n, p in engine.state_dict().items()}
result = {"losses": losses, "norms": norms, "ref_losses": ref_losses, "ref_norms": ref_norms,
          "max_param_diff": max((params[n] - p.detach()).abs().max().item()
                                for n, p in ref_params.items()),
          "dp_world_size": engine.dp_world_size,
          "sequence_parallel_size": engine.sequence_parallel_size}
with open(f"{sys.argv[1]}.rank{accelerator.process_index}.json", "w") as f:
    json.dump(result, f)
