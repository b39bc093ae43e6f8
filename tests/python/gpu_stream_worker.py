"""One process on a GPU (tests/python/test_gpu_streams.py): the tiny GPT of models.py
trained by zeroshard at stage 3, two micro-batches per step, with its optimizer on the
device (OFFLOAD none) or on the host (cpu), the host's step after backward or inside it
(OVERLAP false or true), or split between the two (cpu@RATIO: offload_optimizer.ratio,
the first blocks' state on the device), and the parameter shards on the device or, with PARAMS (cpu, or
a folder for NVMe), in host RAM (sharding/FlatParamGroup.h: each copied up at its gather
without the host waiting) or on NVMe (engine/ParamHome.h: copied up on a copy stream).
DEVICE cpu builds the model on the host and leaves its placement to initialize (the
engine's device, where each batch goes). Writes its losses and the engine's device to
OUT.rank0.json.
usage: gpu_stream_worker.py DEVICE OFFLOAD OVERLAP OUT [PARAMS]"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

STEPS, ACCUMULATION = 6, 2


def main():
    device, offload, overlap, out = sys.argv[1:5]
    import zeroshard
    model = models.make("gpt").to(device)
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}  # every block sharded
    offload, _, ratio = offload.partition("@")
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload, "overlap_step": overlap}
    if ratio:
        zero["offload_optimizer"]["ratio"] = float(ratio)
    if len(sys.argv) > 5 and sys.argv[5] == "cpu":
        zero["offload_param"] = {"device": "cpu"}
    elif len(sys.argv) > 5:
        zero["offload_param"] = {"device": "nvme", "nvme_path": sys.argv[5], "max_in_cpu": 0}
    config = {"train_micro_batch_size_per_gpu": models.GLOBAL_ROWS // 2,
              "gradient_accumulation_steps": ACCUMULATION,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
              "zero_optimization": zero}
    engine, _, _, _ = zeroshard.initialize(model=model, config=config)
    losses = []
    for step in range(STEPS * ACCUMULATION):
        loss = engine(models.batch(step, step % 2, 2).to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with open(f"{out}.rank0.json", "w") as f:
        json.dump({"losses": losses, "device": str(engine.device)}, f)


if __name__ == "__main__":
    main()
