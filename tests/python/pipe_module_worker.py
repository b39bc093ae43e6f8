"""One rank of a DeepSpeed pipeline script, run by DeepSpeed itself (mode deepspeed, its CPU
accelerator over Gloo) or with its imports switched to zeroshard's (mode zeroshard): a small
language model given as layers, its embedding a TiedLayerSpec reused as the output head,
PipelineModule(num_stages=2 or CONFIG's stages, partition_method=PART), train_batch for
STEPS steps, then eval_batch. Writes OUT.rankN.json: each step's returned loss and global
gradient norm, the stage's layer boundaries, the sum of the tied embedding on this rank after
each step, the evaluated loss, and zeroshard's warnings. CONFIG's checkpoint and save_at: the engine saves
there after save_at steps; with resume, it loads it instead and trains on from there.
usage: pipe_module_worker.py deepspeed|zeroshard STEPS OUT CONFIG_JSON [PART]"""
import json
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from rank_result import leave

VOCAB, DIM, SEQ, BLOCKS, MICRO = 64, 32, 12, 4, 2


class Block(nn.Module):
    def __init__(self, dim, dropout=0.0):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.ln(x)))))


def head(embedding, x):
    return x @ embedding.weight.t()


def loss_fn(logits, labels):
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def main():
    import torch.distributed as dist
    mode, steps, out, config = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    part = sys.argv[5] if len(sys.argv) > 5 else "parameters"
    checkpoint, save_at = config.pop("checkpoint", None), config.pop("save_at", 0)
    resume = config.pop("resume", False)
    # The module's own knobs: dropout in the blocks, seed_layers, activation checkpointing
    # every `interval` layers (of the `checkpointable` classes), the stages given as a
    # PipeDataParallelTopology.
    dropout, seed_layers = config.pop("dropout", 0.0), config.pop("seed_layers", False)
    interval, topology = config.pop("interval", 0), config.pop("topology", False)
    checkpointable = config.pop("checkpointable", None)
    stages = config.pop("stages", 2)
    torch.set_num_threads(1)
    if mode == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("LOCAL_SIZE", os.environ["WORLD_SIZE"])
        import deepspeed as ds
        from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
        ds.init_distributed(dist_backend="gloo")
    else:
        import zeroshard as ds
        from zeroshard.pipe import LayerSpec, PipeDataParallelTopology, PipelineModule, TiedLayerSpec
        ds.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    layers = [TiedLayerSpec("embed", nn.Embedding, VOCAB, DIM)]
    layers += [LayerSpec(Block, DIM, dropout) for _ in range(BLOCKS)]
    layers += [LayerSpec(nn.LayerNorm, DIM)]
    layers += [TiedLayerSpec("embed", nn.Embedding, VOCAB, DIM, forward_fn=head)]
    split = dict(topology=PipeDataParallelTopology(
        num_pp=stages, num_dp=int(os.environ["WORLD_SIZE"]) // stages)
    ) if topology else dict(num_stages=stages)
    model = PipelineModule(layers=layers, loss_fn=loss_fn, partition_method=part,
                           seed_layers=seed_layers, activation_checkpoint_interval=interval,
                           checkpointable_layers=checkpointable, **split)
    config = dict(config, train_micro_batch_size_per_gpu=MICRO, gradient_clipping=0.05,
                  optimizer={"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95],
                                                         "eps": 1e-8, "weight_decay": 0.1}})
    engine, _, _, _ = ds.initialize(model=model, config=config,
                                    model_parameters=[p for p in model.parameters()
                                                      if p.requires_grad])
    dp_rank = dist.get_rank() % (dist.get_world_size() // stages)
    g = torch.Generator().manual_seed(1234 + dp_rank)  # the first and the last stage alike

    def batches():
        while True:
            t = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)
            yield t[:, :-1], t[:, 1:]

    data = batches()
    if resume:
        engine.load_checkpoint(checkpoint)
        for _ in range(save_at * config["gradient_accumulation_steps"]):
            next(data)
    losses, norms, tied = [], [], []
    said = warnings.catch_warnings(record=True)
    caught = said.__enter__()
    warnings.simplefilter("always")
    for step in range(save_at if resume else 0, steps):
        losses.append(float(engine.train_batch(data_iter=data)))
        if checkpoint and not resume and step + 1 == save_at:
            engine.save_checkpoint(checkpoint)
        norm = engine.get_global_grad_norm()
        norms.append(None if norm is None else float(norm))
        tied.append(float(model.tied_modules["embed"].weight.detach().double().sum())
                    if "embed" in model.tied_modules else None)  # a stage without it
    # The next step's batch, forward only (torch 2.6's schedules have no eval: refused there).
    from torch.distributed.pipelining import ScheduleGPipe
    evaluated = float(engine.eval_batch(data_iter=data)) if hasattr(ScheduleGPipe, "eval") else None
    said.__exit__(None, None, None)
    dist.barrier()
    result = {"warnings": sorted({str(w.message) for w in caught if "zeroshard" in str(w.message)}),
              "eval_loss": evaluated, "losses": losses, "norms": norms, "tied_sums": tied, "parts": [int(p) for p in
                                                                            model.parts],
              "stage": int(engine.stage_id)}
    if mode == "deepspeed":
        leave(out, result)  # rank_result.py says why
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
