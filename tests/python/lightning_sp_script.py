"""One rank of test_lightning.py's sequence-parallel case: a LightningModule training a
transformers Llama under ZeroShardStrategy(sequence_parallel_size=2) on 2 ranks (Ulysses by
ALST's registration with transformers), each training_step taking this rank's slice of the
batch's sequence (zeroshard.utils.groups) and returning its share of the sequence's mean
loss; and the reference: whole sequences in one process with torch's AdamW. Lightning's
sampler, from the strategy, gives both ranks the same samples.

usage: lightning_sp_script.py OUT STAGE"""
import json
import os
import sys

import lightning as L
import torch
import torch.nn.functional as F

from long_sequence_reference import LR, SEQ, STEPS, make_model, reference, samples
from zeroshard.integrations.lightning import ZeroShardStrategy
from zeroshard.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
from zeroshard.utils import groups

OUT, STAGE = sys.argv[1], int(sys.argv[2])
SP = 2
IDS = samples(STEPS)


class Llama(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model, self.losses, self.seen, self.norms = make_model(), [], [], []

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        self.seen.append(ids[0, :4].tolist())
        labels = F.pad(ids, (0, 1), value=-100)[:, 1:]  # shifted before slicing
        tokens = (labels != -100).sum()
        part = SEQ // SP
        here = slice(groups._get_sequence_parallel_rank() * part,
                     (groups._get_sequence_parallel_rank() + 1) * part)
        logits = self.model(input_ids=ids[:, here],
                            position_ids=torch.arange(SEQ)[None, here]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels[:, here].flatten(),
                               ignore_index=-100, reduction="sum") / tokens
        self.losses.append(loss.item())
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.norms.append(float(self.trainer.strategy.engine.get_global_grad_norm()))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=0.0)


# Lightning's sampler for training: shuffled with seed 0, the group counted once (1 replica).
ORDER = list(torch.utils.data.DistributedSampler(range(STEPS), num_replicas=1, rank=0,
                                                 shuffle=True, seed=0))
ref_losses, ref_norms, ref_params = reference(IDS, lambda step: [ORDER[step]])  # unregistered
torch.distributed.init_process_group("gloo")
UlyssesSPAttentionHF.register_with_transformers(
    model_name_or_path=make_model(), core_attn_implementation="sdpa", sequence_parallel_size=SP,
    micro_batch_size=1, seq_length=SEQ, seq_length_is_variable=True)
module = Llama()
trainer = L.Trainer(strategy=ZeroShardStrategy(stage=STAGE, sequence_parallel_size=SP),
                    accelerator="cpu", devices=SP, max_epochs=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(IDS), batch_size=1)
trainer.fit(module, loader)
engine = trainer.strategy.engine
whole = engine.state_dict()  # a collective: every rank
diff = max((whole[f"model.{n}"] - p.detach()).abs().max().item() for n, p in ref_params.items())
result = {"losses": module.losses, "norms": module.norms, "ref_norms": ref_norms,
          "seen": module.seen, "expected": [IDS[i][:4].tolist() for i in ORDER],
          "ref_losses": ref_losses,
          "max_param_diff": diff, "dp_world_size": engine.dp_world_size}
with open(f"{OUT}.rank{os.environ.get('RANK', trainer.global_rank)}.json", "w") as f:
    json.dump(result, f)
