"""One rank of PP2: a Llama built from CONFIG (config.json, bf16) split in two stages as
zeroshard-estimate --pp 2 splits it (plan/PipelineStages.h: the embedding and the first
half of the blocks; the rest, the final norm and the head), each stage's module on
zeroshard.initialize at stage 3 and run by torch's SCHEDULE (gpipe or 1f1b) through
zeroshard.pipelining.PipelineStage (interleaved1f1b: 4 stages of a block each, stages r and
r + 2 on rank r, one engine's nn.ModuleList, ScheduleInterleaved1F1B), MICROBATCHES micro-batches of MICRO x SEQ tokens, the
head's loss transformers' own (ForCausalLMLoss). During one step it measures the bytes the
stage keeps for backward at their peak: every storage autograd saves that is not a
parameter, and the stage's outputs the schedule holds until their backward, each counted
while it lives. Writes OUT.rankN.json: the stage, its peak, and the activations the
engine's memory_report predicts for it.
usage: pp_activation_worker.py OUT CONFIG SCHEDULE MICRO SEQ MICROBATCHES"""
import json
import os
import sys
import weakref

import torch
import torch.nn as nn
import transformers
from transformers.loss.loss_utils import ForCausalLMLoss


class Stage(nn.Module):
    """Blocks [first, last) of a LlamaForCausalLM, with the embedding before them on the first
    stage and the final norm and the head after them on the last; the model's config kept,
    as a stage cut from a transformers model keeps it (memory_report reads it)."""

    def __init__(self, llama, first, last):
        super().__init__()
        self.config = llama.config
        inner = llama.model
        self.embed = inner.embed_tokens if first == 0 else None
        self.layers = nn.ModuleList(inner.layers[first:last])
        self.rotary = inner.rotary_emb
        last_stage = last == len(inner.layers)
        self.norm = inner.norm if last_stage else None
        self.head = llama.lm_head if last_stage else None

    def forward(self, x):
        h = self.embed(x) if self.embed is not None else x
        positions = torch.arange(h.shape[1]).unsqueeze(0)
        rotary = self.rotary(h, positions)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        return self.head(self.norm(h)) if self.head is not None else h


class LiveBytes:
    """Storages alive, each counted once, and the peak of their sum."""

    def __init__(self, module):
        self.module, self.refs, self.bytes, self.now, self.peak = module, {}, {}, 0, 0

    def hold(self, tensor):
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in {p.untyped_storage().data_ptr() for p in self.module.parameters()}:
            return tensor
        if ptr not in self.refs:
            self.refs[ptr], self.bytes[ptr] = 0, storage.nbytes()
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        self.refs[ptr] += 1
        weakref.finalize(tensor, self.release, ptr)
        return tensor

    def release(self, ptr):
        self.refs[ptr] -= 1
        if self.refs[ptr] == 0:
            self.now -= self.bytes.pop(ptr)
            del self.refs[ptr]


def main():
    out, config_path, schedule_name, micro, seq, microbatches = sys.argv[1:7]
    micro, seq, microbatches = int(micro), int(seq), int(microbatches)
    torch.set_num_threads(1)
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe,
                                               ScheduleInterleaved1F1B)

    import zeroshard
    from zeroshard.pipelining import PipelineStage

    config = transformers.LlamaConfig.from_json_file(config_path)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).to(torch.bfloat16).train()
    rank, layers = int(os.environ["RANK"]), config.num_hidden_layers
    interleaved = schedule_name == "interleaved1f1b"
    if interleaved:  # stages r and r + 2 of 4, as zeroshard-estimate --pp-stages-per-rank 2
        per = layers // 4
        held = (rank, rank + 2)
        module = nn.ModuleList(Stage(llama, s * per, (s + 1) * per) for s in held)
    else:
        bounds = (0, layers // 2) if rank == 0 else (layers // 2, layers)
        module = Stage(llama, *bounds)
    del llama
    engine = zeroshard.initialize(model=module, config={
        "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": microbatches,
        "bf16": {"enabled": True}, "pipeline": {"stages": 2}, "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})[0]
    def loss_fn(logits, labels):
        return ForCausalLMLoss(logits, labels, config.vocab_size)

    if interleaved:
        schedule = ScheduleInterleaved1F1B(
            [PipelineStage(engine, stage_index=s, num_stages=4, submodule=part)
             for s, part in zip(held, module)], n_microbatches=microbatches, loss_fn=loss_fn)
    else:
        schedule = (ScheduleGPipe if schedule_name == "gpipe" else Schedule1F1B)(
            PipelineStage(engine), n_microbatches=microbatches, loss_fn=loss_fn)
    tokens = torch.randint(config.vocab_size, (micro * microbatches, seq),
                           generator=torch.Generator().manual_seed(1))
    live = LiveBytes(engine.module)
    for part in (engine.module if interleaved else [engine.module]):
        part.register_forward_hook(lambda m, args, output: live.hold(output))
    with torch.autograd.graph.saved_tensors_hooks(live.hold, lambda tensor: tensor):
        if rank == 0:  # the first stage (interleaved: and the third; the last is on rank 1)
            schedule.step(tokens)
        else:
            schedule.step(target=tokens)
    engine.step()
    activations = engine.memory_report()["device"]["kinds"]["activations"]
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"stage": rank, "peak": live.peak, "reported": activations["predicted"]}, f)


if __name__ == "__main__":
    main()
