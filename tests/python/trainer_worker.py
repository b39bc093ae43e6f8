"""One rank of a Hugging Face Trainer run: hf_worker's Llama trained by
transformers.Trainer under DDP (mode ddp: the Trainer wraps it itself, as it does when
started by torchrun), or by zeroshard.integrations.ZeroShardTrainer (mode zs, a
zeroshard config given as JSON), with the same TrainingArguments: AdamW with decay and
no-decay groups, linear warmup and decay, gradient accumulation 4, clipping at 1.0, on
rows whose prompts (of different lengths) are masked out of the loss.
Writes the losses and grad norms the Trainer logged, one per step, to OUT.rankN.json;
then saves the model with trainer.save_model(OUT.model) (rank 0 of a DDP run alone
writes; every rank of a zeroshard run takes part).
With ZS_TRAINER_SAVE_STEPS=N the Trainer checkpoints every N steps (save_strategy
"steps"); with ZS_TRAINER_RESUME=DIR it resumes from that checkpoint. With
ZS_TRAINER_BEST=checkpoint (or save_only_model, where checkpoints hold the model alone)
it also evaluates every N steps and ends with load_best_model_at_end (the best: the
highest eval loss), and rank 0 writes the best checkpoint's name to OUT.best.json. With
ZS_TRAINER_COMPILE=1, torch_compile is on. Rank 0 writes the class of the model the
Trainer's loop called (model_wrapped) to OUT.wrapped.json.
With ZS_TRAINER_SP (above ROWS) the rows split over a sequence's ranks (ZS_TRAINER_CP=N:
with torch's context parallelism over N ranks instead), and ZS_TRAINER_ACCUMULATION=N sets
gradient_accumulation_steps.
Mode zs-deepspeed: the config given as DeepSpeed Trainer scripts give it,
TrainingArguments(deepspeed="ds_config.json"); mode zs without CONFIG_JSON: no config.
usage: trainer_worker.py ddp|zs|zs-deepspeed STEPS OUT [CONFIG_JSON]"""
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import devices  # noqa: E402
import hf_worker  # noqa: E402
import models  # noqa: E402
from rank_result import leave  # noqa: E402,F401  (the Trainer workers' way out)

ROWS = 64  # the dataset: random token rows (models.VOCAB, models.SEQ + 1 tokens)
# ZS_TRAINER_SP=N: rows of models.SEQ tokens (they split over the ranks of a sequence), and
# with N > 1 TrainingArguments.parallelism_config with DeepSpeed's sequence parallelism.
SP = int(os.environ.get("ZS_TRAINER_SP", "0"))
CP = int(os.environ.get("ZS_TRAINER_CP", "0"))


class Rows(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(7)
        length = models.SEQ if SP else models.SEQ + 1
        self.tokens = torch.randint(models.VOCAB, (ROWS, length), generator=g)

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        # Supervised fine-tuning's rows: a prompt of 1 to 12 tokens the loss ignores, so
        # micro-batches hold different numbers of target tokens.
        labels = self.tokens[i].clone()
        labels[:1 + (5 * i) % 12] = -100
        return {"input_ids": self.tokens[i], "labels": labels}


def llama():
    """hf_worker's Llama; with ZS_TRAINER_SP attending with sdpa (accelerate takes neither
    eager nor flex attention for sequence parallelism), in both runs compared."""
    model = hf_worker.make("llama")
    if SP:
        model.config._attn_implementation = "sdpa"
    return model


class Record(transformers.TrainerCallback):
    def __init__(self):
        self.logged = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logged.append([logs["loss"], float(logs["grad_norm"])])


def main():
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    save_steps = int(os.environ.get("ZS_TRAINER_SAVE_STEPS", "0"))
    best = os.environ.get("ZS_TRAINER_BEST")  # "checkpoint" or "save_only_model"
    if best:  # "best": the highest eval loss, the first evaluation's as the loss falls
        extra = dict(eval_strategy="steps", eval_steps=save_steps, load_best_model_at_end=True,
                     metric_for_best_model="eval_loss", greater_is_better=True,
                     save_only_model=best == "save_only_model")
    else:
        extra = {}
    if CP > 1:
        from accelerate import ParallelismConfig
        extra["parallelism_config"] = ParallelismConfig(cp_size=CP)
    elif SP > 1:
        from accelerate import ParallelismConfig
        from accelerate.utils import DeepSpeedSequenceParallelConfig
        handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True,
                                                  sp_attn_implementation="sdpa")
        extra["parallelism_config"] = ParallelismConfig(sp_backend="deepspeed", sp_size=SP,
                                                        sp_handler=handler)
    args = transformers.TrainingArguments(
        output_dir=out + ".trainer", max_steps=steps, per_device_train_batch_size=2,
        gradient_accumulation_steps=int(os.environ.get("ZS_TRAINER_ACCUMULATION", "4")), learning_rate=1e-2, weight_decay=0.1, adam_beta1=0.9,
        adam_beta2=0.95, adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="linear",
        warmup_steps=2, optim=os.environ.get("ZS_TRAINER_OPTIM", "adamw_torch"), logging_steps=1,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        report_to=[], use_cpu=devices.device().type == "cpu", seed=1234, data_seed=1234,
        disable_tqdm=True,
        dataloader_drop_last=True, torch_compile=os.environ.get("ZS_TRAINER_COMPILE") == "1",
        **extra)
    record = Record()
    kwargs = dict(args=args, train_dataset=Rows(), callbacks=[record],
                  eval_dataset=Rows() if best else None)
    if mode == "ddp":
        trainer = transformers.Trainer(model=llama(), **kwargs)
    elif mode == "zs-deepspeed":  # DeepSpeed's way in: --deepspeed ds_config.json, parsed
        from zeroshard.integrations import ZeroShardTrainer  # before the model is built,
        path = f"{out}.ds_config.json"  # which is then built from its config (run_clm.py's order)
        with open(path, "w") as f:
            f.write(sys.argv[4])
        kwargs["args"] = transformers.TrainingArguments(
            **dict(kwargs["args"].to_dict(), deepspeed=path))
        trainer = ZeroShardTrainer(model=hf_worker.make("llama", from_config=True), **kwargs)
    else:
        from zeroshard.integrations import ZeroShardTrainer
        config = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
        kwargs["model"] = llama()
        trainer = ZeroShardTrainer(zeroshard_config=config, **kwargs) if config \
            else ZeroShardTrainer(**kwargs)  # only the import changed: no config at all
    trainer.train(resume_from_checkpoint=os.environ.get("ZS_TRAINER_RESUME"))
    trainer.save_model(out + ".model")
    if int(os.environ["RANK"]) == 0:  # what the Trainer's loop called: compiled or not
        with open(f"{out}.wrapped.json", "w") as f:
            json.dump(type(trainer.model_wrapped).__name__, f)
    if best and int(os.environ["RANK"]) == 0:
        with open(f"{out}.best.json", "w") as f:
            json.dump(os.path.basename(trainer.state.best_model_checkpoint), f)
    leave(out, record.logged)


if __name__ == "__main__":
    main()
