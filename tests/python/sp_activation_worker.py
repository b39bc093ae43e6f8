"""One rank of test_activation_memory.py's sequence-parallel case: the bytes its slice of
each sequence keeps for backward, the model run on those tokens alone, then with Ulysses
over every rank (ALST's registration with transformers); and the activations the engine's
memory_report() predicts after training on those slices with sequence_parallel_size.

usage: sp_activation_worker.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
import transformers

import zeroshard
from test_activation_memory import BATCH, SEQ, configs, kept_for_backward
from zeroshard.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

zeroshard.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
config = configs()["llama"]
config._attn_implementation = "sdpa"
tokens = (rank * SEQ // world, (rank + 1) * SEQ // world)
result = {"slice_alone": kept_for_backward(config, tokens=tokens)}
mpu = UlyssesSPAttentionHF.register_with_transformers(
    model_name_or_path=transformers.AutoModelForCausalLM.from_config(config),
    core_attn_implementation="sdpa", sequence_parallel_size=world,
    micro_batch_size=BATCH, seq_length=SEQ, seq_length_is_variable=True)
result["kept"] = kept_for_backward(config, tokens=tokens)
model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
engine = zeroshard.initialize(model=model, mpu=mpu, config={
    "train_micro_batch_size_per_gpu": BATCH, "bf16": {"enabled": True},
    "sequence_parallel_size": world, "zero_optimization": {"stage": 3},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})[0]
ids = torch.zeros(BATCH, SEQ // world, dtype=torch.long)
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()
result["predicted"] = engine.memory_report()["device"]["kinds"]["activations"]["predicted"]
with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
    json.dump(result, f)
