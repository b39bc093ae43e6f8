"""One process serving FOLDER (hf_worker's Llama, save_pretrained) with DeepSpeed's
weight_quantization.quantized_initialization (NUM_BITS, groups of 32, asymmetric) at
stage 3, through PEER: DeepSpeed 0.19.8's own ZeRO-3 engine (HfDeepSpeedConfig,
from_pretrained under its zero.Init, deepspeed.initialize), zeroshard.init_inference with
the same config, or the plain model unquantized. Writes OUT.rank0.json: one forward's
logits and the greedy tokens of a fixed prompt set.
usage: quantized_peer_worker.py OUT FOLDER NUM_BITS DTYPE PEER"""
import json
import os
import sys

import torch
import transformers

out, folder, bits, dtype, peer = sys.argv[1:6]
dtype = getattr(torch, dtype)
config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
          "weight_quantization": {"quantized_initialization": {
              "num_bits": int(bits), "group_size": 32, "group_dim": 1, "symmetric": False}}}
if dtype == torch.bfloat16:
    config["bf16"] = {"enabled": True}
if peer == "deepspeed":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_SIZE", "1")
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig
    deepspeed.init_distributed(dist_backend="gloo")
    keep = HfDeepSpeedConfig(config)  # noqa: F841 (from_pretrained builds under zero.Init)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = deepspeed.initialize(model=model, config_params=config)[0].module
elif peer == "zeroshard":
    import zeroshard
    model = zeroshard.init_inference(folder, config=config, dtype=dtype)
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
model.eval()
vocab = transformers.AutoConfig.from_pretrained(folder).vocab_size
prompts = torch.randint(3, vocab, (2, 6), generator=torch.Generator().manual_seed(7))
with torch.no_grad():
    logits = model(input_ids=prompts).logits.float()
    tokens = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=6,
                            do_sample=False, pad_token_id=0)
with open(f"{out}.rank0.json", "w") as f:
    json.dump({"logits": logits.flatten().tolist(), "tokens": tokens.tolist()}, f)
