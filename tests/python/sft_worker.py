"""One rank of a TRL run: trl.SFTTrainer fine-tunes LoRA adapters (peft) on hf_worker's
Llama, under DDP as the plain SFTTrainer does it when started by torchrun (mode ddp), or
on zeroshard's engine through zeroshard_trainer(SFTTrainer) (mode zs, a zeroshard config
given as JSON). Both take the same SFTConfig: accumulation 4, clipping at 1.0, linear
warmup and decay, and pre-tokenized rows whose completion_mask leaves prompts of
different lengths out of the loss. The tokenizer is built here (a word per token id):
nothing is downloaded.
Writes the losses and grad norms the Trainer logged, one per step, to OUT.rankN.json;
then trainer.save_model(OUT.adapter), which writes what PEFT writes: the adapter alone;
then merges the adapters into the base weights and writes the last position's logits
of a batch before the merge and how far the merge moved them.
With ZS_SFT_CHECKPOINTING=1 both runs use Hugging Face's gradient checkpointing. With
ZS_SFT_SAVE_STEPS=N the Trainer checkpoints every N steps; with ZS_SFT_RESUME=DIR it
resumes from that checkpoint.
usage: sft_worker.py ddp|zs STEPS OUT [CONFIG_JSON]"""
import json
import os
import sys

import datasets
import peft
import tokenizers
import torch
import transformers
import trl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_worker  # noqa: E402
import models  # noqa: E402
from trainer_worker import Record, leave  # noqa: E402
from zero3_worker import held_by_parameters  # noqa: E402

ROWS = 64
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
            task_type="CAUSAL_LM")


def tokenizer():
    vocab = {f"w{i}": i for i in range(hf_worker.VOCAB)}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0",
                                                pad_token="w1", eos_token="w2")


def rows():
    """Token rows with a prompt of 1 to 12 tokens masked out of the loss."""
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(3, models.VOCAB, (ROWS, models.SEQ + 1), generator=g).tolist()
    masks = [[0] * (1 + (5 * i) % 12) + [1] * (models.SEQ - (5 * i) % 12) for i in range(ROWS)]
    return datasets.Dataset.from_dict({"input_ids": tokens, "completion_mask": masks})


def memory(model, engine):
    """What this rank holds of the parameters: frozen (the base) and trained (the
    adapters) elements, each unit's elements, the ledger's device bytes of parameter
    shards and its peak of gathered ones, and the bytes the model's parameter tensors
    point at."""
    params = {id(p): p for p in model.parameters()}.values()
    kinds = engine.memory_report()["device"]["kinds"]
    return {"frozen": sum(p.numel() for p in params if not p.requires_grad),
            "trained": sum(p.numel() for p in params if p.requires_grad),
            "units": [sum(p.numel() for _, p in ps) for _, ps in engine._units],
            "params": kinds["params"]["current"],
            "gathered_peak": kinds["gathered_params"]["peak"],
            "held_by_parameters": held_by_parameters(model)}


def merge(model, mode):
    """The adapters merged into the base weights (PEFT's merge_adapter; under the engine
    inside GatheredParameters, rank 0's merge written back to the shards): the logits of
    a batch before and after, which should not change."""
    ids = torch.arange(3, 3 + models.SEQ).reshape(1, -1)
    model.eval()
    with torch.no_grad():
        before = model(input_ids=ids).logits
        if mode == "zs":
            import zeroshard
            with zeroshard.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
                model.merge_adapter()
        else:
            model.merge_adapter()
        after = model(input_ids=ids).logits
    return {"before": before[0, -1].tolist(), "change": float((after - before).abs().max())}


def main():
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    checkpointing = os.environ.get("ZS_SFT_CHECKPOINTING") == "1"
    args = trl.SFTConfig(
        output_dir=out + ".trainer", max_steps=steps, per_device_train_batch_size=2,
        gradient_accumulation_steps=4, learning_rate=1e-2, weight_decay=0.1, adam_beta1=0.9,
        adam_beta2=0.95, adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="linear",
        warmup_steps=2, logging_steps=1, report_to=[], use_cpu=True,
        save_strategy="steps" if os.environ.get("ZS_SFT_SAVE_STEPS") else "no",
        save_steps=int(os.environ.get("ZS_SFT_SAVE_STEPS", "500")),
        bf16=False, seed=1234, data_seed=1234, disable_tqdm=True, dataloader_drop_last=True,
        gradient_checkpointing=checkpointing, dataset_num_proc=None)
    record = Record()
    kwargs = dict(model=hf_worker.make("llama"), args=args, train_dataset=rows(),
                  processing_class=tokenizer(), peft_config=peft.LoraConfig(**LORA),
                  callbacks=[record])
    if mode == "ddp":
        trainer = trl.SFTTrainer(**kwargs)
    else:
        from zeroshard.integrations import zeroshard_trainer
        trainer = zeroshard_trainer(trl.SFTTrainer)(zeroshard_config=json.loads(sys.argv[4]),
                                                     **kwargs)
    trainer.train(resume_from_checkpoint=os.environ.get("ZS_SFT_RESUME"))
    result = {"logged": record.logged}
    if mode == "zs":
        result["memory"] = memory(trainer.model, trainer.zeroshard_engine)
    trainer.save_model(out + ".adapter")
    result["merge"] = merge(trainer.model, mode)
    leave(out, result)


if __name__ == "__main__":
    main()
