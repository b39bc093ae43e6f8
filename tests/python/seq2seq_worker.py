"""One rank of a Seq2SeqTrainer run: hf_worker's T5 trained for a few steps, then
predicting with generation (predict_with_generate), under DDP as the plain
Seq2SeqTrainer does it when started by torchrun (mode ddp), or on zeroshard's engine
through zeroshard_trainer(Seq2SeqTrainer) (mode zs, a zeroshard config given as JSON).

The prediction runs twice. First with no end-of-sequence token, so every row generates
generation_max_length tokens. Then the end token becomes the first token that run
generated for the first row of rank 0 (one that rank 1's first row never generates), so
rank 0 stops early where rank 1 goes on: at stage 3 every rank must take part
in every forward, which is what generate's synced_gpus does.
Writes to OUT.rankN.json the losses logged in training, the two runs' predictions
(every row, as each rank gets them) and their test losses, and the end token chosen.
usage: seq2seq_worker.py ddp|zs STEPS OUT [CONFIG_JSON]"""
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_worker  # noqa: E402
import models  # noqa: E402
from trainer_worker import Record, leave  # noqa: E402

ROWS, EVAL_ROWS, TARGET = 32, 8, 6


class Pairs(torch.utils.data.Dataset):
    """Token rows and a target of TARGET tokens for each (their first tokens, reversed)."""

    def __init__(self, rows, seed):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(2, models.VOCAB, (rows, models.SEQ), generator=g)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i, :TARGET].flip(0)}


def predict(trainer):
    out = trainer.predict(Pairs(EVAL_ROWS, 11))
    return out.predictions.tolist(), float(out.metrics["test_loss"])


def end_token(rows):
    """The earliest token generated for row 0 that row 1 never generates (rank 0 and
    rank 1 predict rows 0 and 1 first: one row per rank and batch)."""
    for token in rows[0][1:]:  # after the decoder's start token
        if token not in rows[1]:
            return token
    raise SystemExit(f"row 1 generates every token row 0 does ({rows[0]}, {rows[1]}): "
                     "choose other data")


def main():
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    args = transformers.Seq2SeqTrainingArguments(
        output_dir=out + ".trainer", max_steps=steps, per_device_train_batch_size=2,
        per_device_eval_batch_size=1, gradient_accumulation_steps=2, learning_rate=1e-3,
        weight_decay=0.1, max_grad_norm=1.0, lr_scheduler_type="linear", warmup_steps=1,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=1234,
        data_seed=1234, disable_tqdm=True, dataloader_drop_last=True,
        predict_with_generate=True, generation_max_length=TARGET + 2)
    record = Record()
    model = hf_worker.make("t5")
    model.generation_config.eos_token_id = None  # the first run: every row at full length
    model.generation_config.suppress_tokens = [0]  # the pad token, which a random T5 prefers
    kwargs = dict(model=model, args=args, train_dataset=Pairs(ROWS, 7), callbacks=[record])
    if mode == "ddp":
        trainer = transformers.Seq2SeqTrainer(**kwargs)
    else:
        from zeroshard.integrations import zeroshard_trainer
        trainer = zeroshard_trainer(transformers.Seq2SeqTrainer)(
            zeroshard_config=json.loads(sys.argv[4]), **kwargs)
    trainer.train()
    full, full_loss = predict(trainer)
    model.generation_config.eos_token_id = end_token(full)
    ended, ended_loss = predict(trainer)
    leave(out, {"logged": record.logged, "full": full, "full_loss": full_loss,
                "end": model.generation_config.eos_token_id, "ended": ended,
                "ended_loss": ended_loss})


if __name__ == "__main__":
    main()
