"""One rank of an accelerate training loop, written as transformers' run_clm_no_trainer.py
writes it (accumulate(), backward, clipping at the boundary, optimizer and scheduler
stepped every micro-batch, the scheduler's length times the processes), over
hf_worker's Llama: by accelerate's own Accelerator (mode accelerate: DDP) or by zeroshard's
(mode zs, the zeroshard config given as JSON). Writes each micro-batch's loss averaged over
the ranks and, at the end, the whole parameters (get_state_dict) to OUT.rankN.json. With
ZS_ACCELERATE_SAVE=DIR, save_state(DIR) after 2 steps and save_model(DIR.model) at the end
(read back by from_pretrained); with ZS_ACCELERATE_LOAD=DIR, load_state(DIR) first and the
epoch's remaining batches.
usage: accelerate_worker.py accelerate|zs STEPS OUT [CONFIG_JSON]"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import devices  # noqa: E402
import hf_worker  # noqa: E402
import models  # noqa: E402

ROWS = int(os.environ.get("ZS_ACCELERATE_ROWS", "48"))  # 44: 11 micro-batches a rank
MICRO, ACCUMULATION = 2, 2
SAVED_AT = 2  # steps, where ZS_ACCELERATE_SAVE saves the state and ZS_ACCELERATE_LOAD resumes


def rows():
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(models.VOCAB, (ROWS, models.SEQ + 1), generator=g)
    return [{"input_ids": t, "labels": t} for t in tokens]


def main():
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    from transformers import get_scheduler
    on_cpu = devices.device().type == "cpu"  # (the model is left on the host: prepare places it)
    if mode == "accelerate":
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=on_cpu, gradient_accumulation_steps=ACCUMULATION)
    else:
        from zeroshard.integrations import Accelerator
        accelerator = Accelerator(cpu=on_cpu, gradient_accumulation_steps=ACCUMULATION,
                                  zeroshard_config=json.loads(sys.argv[4]))
    model = hf_worker.make("llama")
    decay = [p for n, p in model.named_parameters() if "norm" not in n]
    rest = [p for n, p in model.named_parameters() if "norm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": rest, "weight_decay": 0.0}], lr=1e-2,
                                  betas=(0.9, 0.95), eps=1e-8)
    loader = torch.utils.data.DataLoader(rows(), batch_size=MICRO, shuffle=True,
                                         generator=torch.Generator().manual_seed(3))
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=2 * accelerator.num_processes,
                              num_training_steps=steps * accelerator.num_processes)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses, done = [], 0
    saved, loaded = os.environ.get("ZS_ACCELERATE_SAVE"), os.environ.get("ZS_ACCELERATE_LOAD")
    if loaded:  # resume after SAVED_AT steps: the rest of the epoch's batches
        accelerator.load_state(loaded)
        loader, done = accelerator.skip_first_batches(loader, SAVED_AT * ACCUMULATION), SAVED_AT
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()[None]).mean().item())
        done += accelerator.sync_gradients
        if saved and accelerator.sync_gradients and done == SAVED_AT:
            accelerator.save_state(saved)
        if done == steps:
            break
    state = accelerator.get_state_dict(model)
    result = {"losses": losses, "params": {k: v.tolist() for k, v in state.items()},
              "unwrapped": type(accelerator.unwrap_model(model)).__name__}
    if saved:  # the weights as accelerate writes them, read back by transformers
        accelerator.save_model(model, saved + ".model")
        if accelerator.is_main_process:
            from transformers import AutoModelForCausalLM
            accelerator.unwrap_model(model).config.save_pretrained(saved + ".model")
            back = AutoModelForCausalLM.from_pretrained(saved + ".model").state_dict()
            result["from_pretrained_diff"] = max(
                (back[k] - v.cpu()).abs().max().item() for k, v in state.items())
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(result, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
