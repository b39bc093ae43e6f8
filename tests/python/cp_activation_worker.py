"""One rank of test_activation_memory.py's context-parallel case: the bytes its share of
each sequence keeps for backward, the model run on those tokens alone, then with torch's
ring attention over every rank (context_parallel over a "cp" mesh, its head-tail load
balancing: this rank's two chunks); and the activations the engine's memory_report()
predicts after training on those slices with a ("dp", "cp") mesh.

usage: cp_activation_worker.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

import zeroshard
from test_activation_memory import BATCH, SEQ, configs, kept_for_backward
from zeroshard._sequence.context_parallel import enable_cpu_ring_attention

zeroshard.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
config = configs()["llama"]
config._attn_implementation = "sdpa"
result = {"slice_alone": kept_for_backward(config, tokens=(0, SEQ // world))}
enable_cpu_ring_attention()
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()
params = {p.untyped_storage().data_ptr() for p in model.parameters()}
saved = {}


def pack(tensor):
    """Each storage once (a DTensor's local tensor's), as kept_for_backward counts them."""
    local = getattr(tensor, "_local_tensor", tensor)
    storage = local.untyped_storage()
    if storage.data_ptr() not in params:
        saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
    return tensor


ids = torch.randint(config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
positions = torch.arange(SEQ).expand(BATCH, -1).contiguous()
with context_parallel(mesh["cp"], buffers=[ids, positions], buffer_seq_dims=[1, 1],
                      no_restore_buffers={ids, positions}):
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(input_ids=ids, labels=ids, position_ids=positions)
logits = out.logits.untyped_storage()
result["kept"] = sum(saved.values()) + (0 if logits.data_ptr() in saved else logits.nbytes())
# The engine given a ("dp", "cp") mesh, trained on the ring's slices: the activations its
# memory_report predicts.
mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "cp"))
model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
engine = zeroshard.initialize(model=model, mesh=mesh, config={
    "train_micro_batch_size_per_gpu": BATCH, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})[0]
ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
positions = torch.arange(SEQ).expand(BATCH, -1).contiguous()
with context_parallel(mesh["cp"], buffers=[ids, positions], buffer_seq_dims=[1, 1],
                      no_restore_buffers={ids, positions}):
    engine.backward(engine(input_ids=ids, labels=ids, position_ids=positions).loss)
engine.step()
result["predicted"] = engine.memory_report()["device"]["kinds"]["activations"]["predicted"]
with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
    json.dump(result, f)
