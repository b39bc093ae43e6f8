"""One rank of test_activation_policy.py: a transformers Llama of LAYERS blocks trained for
three steps under each activation_checkpointing.mode at ZeRO stages 2 and 3 (bf16), with
the losses, gradient norms, blocks recomputed per forward (torch's checkpoint calls),
the layers the engine chose and memory_report's predicted activations of each; under
auto, the layers it chooses for batches of LONG tokens and the capacity it plans with.

usage: activation_policy_worker.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
import transformers

import zeroshard
from test_activation_memory import BATCH, SEQ
from test_activation_policy import LONG, POLICIES, layered
from zeroshard._activations import policy as recompute_policy
from zeroshard._activations.shapes import model_shape

zeroshard.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
config = layered("llama")
calls = [0]
checkpoint = recompute_policy.torch_checkpoint.checkpoint


def counted(*args, **kwargs):
    calls[0] += 1
    return checkpoint(*args, **kwargs)


recompute_policy.torch_checkpoint.checkpoint = counted
ids = torch.randint(config.vocab_size, (3, BATCH, SEQ),
                    generator=torch.Generator().manual_seed(rank))
result = {}
for stage in (2, 3):
    for name, keys in POLICIES.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        engine = zeroshard.initialize(model=model, config={
            "train_micro_batch_size_per_gpu": BATCH, "bf16": {"enabled": True},
            "zero_optimization": {"stage": stage}, "activation_checkpointing": keys,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})[0]
        run = {"losses": [], "norms": [], "calls": []}
        for step in range(3):
            calls[0] = 0
            loss = engine(input_ids=ids[step], labels=ids[step]).loss
            run["calls"].append(calls[0])
            engine.backward(loss)
            engine.step()
            run["losses"].append(loss.item())
            run["norms"].append(engine.get_global_grad_norm())
        run["layers"] = engine._engine.recomputed_layers()
        run["predicted"] = engine.memory_report()["device"]["kinds"]["activations"]["predicted"]
        if name == "auto":  # batches too long to run here, told as a forward tells them
            hf_json, attention, _ = model_shape(model, config)
            run["long"] = []
            for seq in LONG:
                engine._engine.set_activation_shape(hf_json, attention, seq, BATCH, False, True)
                run["long"].append(engine._engine.recomputed_layers())
            run["capacity"] = engine.memory_report()["device"]["capacity"]
        result[f"{name} stage {stage}"] = run
with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
    json.dump(result, f)
