"""One rank of a TRL DPOTrainer run on hf_worker's Llama, under DDP as the plain
DPOTrainer does it when started by torchrun (mode ddp), or on zeroshard's engine through
zeroshard_trainer(DPOTrainer) (mode zs, a zeroshard config given as JSON). KIND "lora":
LoRA adapters trained, the reference being the model with its adapters off; KIND
"reference": every weight trained against a reference model of its own (at stage 3 it is
sharded by an engine of its own). Prompts, chosen and rejected answers are random words
of sft_worker's tokenizer. With ZS_DPO_SYNC_REF=1, sync_ref_model is on.
Writes the losses and grad norms the Trainer logged, one per step, and what a reference
engine holds (its parameter shards' bytes, the reference model's elements, any other
bytes it holds), to OUT.rankN.json.
usage: dpo_worker.py ddp|zs KIND STEPS OUT [CONFIG_JSON]"""
import json
import os
import sys

import datasets
import peft
import torch
import trl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_worker  # noqa: E402
from sft_worker import LORA, tokenizer  # noqa: E402
from trainer_worker import Record, leave  # noqa: E402


def rows(count=32):
    g = torch.Generator().manual_seed(3)

    def words(n):
        return " ".join(f"w{int(i)}" for i in torch.randint(3, 60, (n,), generator=g))

    return datasets.Dataset.from_list(
        [{"prompt": words(4), "chosen": words(3), "rejected": words(3)} for _ in range(count)])


def main():
    mode, kind, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    args = trl.DPOConfig(
        output_dir=out + ".trainer", max_steps=steps, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, learning_rate=1e-3, max_grad_norm=1.0, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=1, data_seed=1,
        disable_tqdm=True, gradient_checkpointing=False,
        sync_ref_model=os.environ.get("ZS_DPO_SYNC_REF") == "1")
    record = Record()
    kwargs = dict(model=hf_worker.make("llama"), args=args, train_dataset=rows(),
                  processing_class=tokenizer(), callbacks=[record])
    if kind == "lora":
        kwargs["peft_config"] = peft.LoraConfig(**LORA)
    else:
        kwargs["ref_model"] = hf_worker.make("llama")
    if mode == "ddp":
        trainer = trl.DPOTrainer(**kwargs)
    else:
        from zeroshard.integrations import zeroshard_trainer
        trainer = zeroshard_trainer(trl.DPOTrainer)(zeroshard_config=json.loads(sys.argv[5]),
                                                    **kwargs)
    trainer.train()
    result = {"logged": record.logged}
    reference = getattr(trainer, "zeroshard_reference_engine", None)
    if reference is not None:
        kinds = reference.memory_report()["device"]["kinds"]
        result["reference"] = {
            "params": kinds["params"]["current"],
            "elements": sum(p.numel() for p in trainer.ref_model.parameters()),
            "held_besides": {k: v["current"] for k, v in kinds.items()
                             if k != "params" and v["current"]}}
    leave(out, result)


if __name__ == "__main__":
    main()
