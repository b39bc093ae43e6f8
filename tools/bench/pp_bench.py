#!/usr/bin/env python3
"""zs bench pp: pipeline parallelism composed with sharding, PP2 x DP2 on 4 local ranks (Gloo,
one thread each): a GPT of 4 blocks split in two stages, 8 micro-batches a step, the same
weights, batches and AdamW for every row: zeroshard stage 3 under torch's Schedule1F1B and
ScheduleGPipe (zeroshard.pipelining.PipelineStage), and FSDP2 under Schedule1F1B, torch's
own composition (fully_shard per block and per stage root over the stage's dp mesh, torch's
PipelineStage over the FSDPModule, as torchtitan builds it). Prints tokens/s and peak RSS as
ratios, the final losses, and GPipe's step time over 1F1B's beside the schedules' bubble
model (p - 1) / (m + p - 1), which is the same for both: they differ in activation memory,
not in idle time. On a machine with fewer cores than ranks the stages share cores, so an
idle stage gives its time to the other and the bubble does not show in step time.
Run: ./zs bench pp [--json] [--steps N]."""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

from local_ranks import run_ranks

WORLD, STAGES, MICROBATCHES = 4, 2, 8
VOCAB, DIM, HEADS, LAYERS, SEQ, MICRO, WARMUP = 1024, 256, 8, 4, 128, 2, 2


def modules():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
            self.qkv, self.o = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, DIM)
            self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, DIM))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, DIM)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS // 2))

        def forward(self, tokens):
            x = self.emb(tokens)
            for b in self.blocks:
                x = b(x)
            return x

    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS // 2))
            self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return First(), Last()


def loss_fn(logits, targets):
    import torch.nn.functional as F
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def batch(step, dp_rank):
    import torch
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    return torch.randint(0, VOCAB, (MICRO * MICROBATCHES, SEQ + 1), generator=g)


def worker(mode, steps, out):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    per_stage = WORLD // STAGES
    stage_index, dp_rank = rank // per_stage, rank % per_stage
    module = modules()[stage_index]
    schedule_class = ScheduleGPipe if mode.endswith("gpipe") else Schedule1F1B
    if mode.startswith("zeroshard"):
        import zeroshard
        from zeroshard.pipelining import PipelineStage
        config = {"train_micro_batch_size_per_gpu": MICRO,
                  "gradient_accumulation_steps": MICROBATCHES, "gradient_clipping": 1.0,
                  "pipeline": {"stages": STAGES}, "zero_optimization": {"stage": 3},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}}}
        engine, *_ = zeroshard.initialize(model=module, config=config)
        stage = PipelineStage(engine)
        step_optimizer = engine.step
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.pipelining import PipelineStage
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (STAGES, per_stage), mesh_dim_names=("pp", "dp"))
        for block in module.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(module, mesh=mesh["dp"])
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3, weight_decay=0.0, foreach=False)
        # Shapes given: torch's runtime inference runs the module on meta tensors, which a
        # module holding real weights refuses.
        shape = (MICRO, SEQ)
        inputs = (torch.empty(shape, dtype=torch.long, device="meta") if stage_index == 0
                  else torch.empty(shape + (DIM,), device="meta"))
        outputs = torch.empty(shape + ((DIM,) if stage_index == 0 else (VOCAB,)), device="meta")
        stage = PipelineStage(module, stage_index, STAGES, torch.device("cpu"),
                              input_args=inputs, output_args=outputs,
                              group=mesh.get_group("pp"))

        def step_optimizer():
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            local = sum(g.norm().full_tensor() ** 2 for g in grads)
            dist.all_reduce(local, group=mesh.get_group("pp"))  # both stages' norm
            scale = min(1.0, 1.0 / (float(local) ** 0.5 + 1e-6))
            for g in grads:
                g.mul_(scale)
            opt.step()
            opt.zero_grad()
    schedule = schedule_class(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    losses, start = [], None
    for step in range(steps + WARMUP):
        if step == WARMUP:
            start = time.perf_counter()
        tokens = batch(step, dp_rank)
        micro_losses = []
        if stage_index == 0:
            schedule.step(tokens[:, :-1].contiguous())
        else:
            schedule.step(target=tokens[:, 1:].contiguous(), losses=micro_losses)
        step_optimizer()
        if micro_losses:
            losses.append(sum(float(x) for x in micro_losses) / len(micro_losses))
    seconds = time.perf_counter() - start
    row = {"system": mode, "seconds_per_step": seconds / steps,
           "tokens_per_second": steps * MICRO * MICROBATCHES * SEQ * per_stage / seconds,
           "final_loss": losses[-1] if losses else None,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(row, f)


def run(mode, steps, scratch):
    out = os.path.join(scratch, mode)
    rows, error = run_ranks(__file__, ["--worker", mode, str(steps), out], WORLD, out,
                            timeout=1800)
    if error:
        return {"system": mode, "error": error}
    row = dict(rows[-1])  # the last stage's: it reports the loss
    row["seconds_per_step"] = max(r["seconds_per_step"] for r in rows)
    row["tokens_per_second"] = min(r["tokens_per_second"] for r in rows)
    row["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rows)
    return row


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = ("zeroshard_1f1b", "zeroshard_gpipe", "fsdp2_1f1b")
    with tempfile.TemporaryDirectory() as scratch:
        rows = {m: run(m, args.steps, scratch) for m in modes}
    result = {"rows": list(rows.values()),
              "bubble_model": (STAGES - 1) / (MICROBATCHES + STAGES - 1)}
    zs, gpipe, fsdp = (rows[m] for m in modes)
    if "error" not in zs and "error" not in fsdp:
        result["zs3_1f1b_vs_fsdp2_1f1b_throughput"] = (zs["tokens_per_second"]
                                                       / fsdp["tokens_per_second"])
        result["zs3_1f1b_vs_fsdp2_1f1b_peak_rss"] = zs["peak_rss_bytes"] / fsdp["peak_rss_bytes"]
    if "error" not in zs and "error" not in gpipe:
        result["gpipe_vs_1f1b_step_time"] = gpipe["seconds_per_step"] / zs["seconds_per_step"]
        result["gpipe_vs_1f1b_peak_rss"] = gpipe["peak_rss_bytes"] / zs["peak_rss_bytes"]
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for r in rows.values():
        if "error" in r:
            print(f"{r['system']:>16}: failed: {r['error']}")
            continue
        print(f"{r['system']:>16}: {r['tokens_per_second']:8.1f} tokens/s  "
              f"{r['seconds_per_step']:6.3f} s/step  peak RSS {r['peak_rss_bytes'] / 2**20:7.1f} "
              f"MiB  final loss {r['final_loss']:.5f}")
    print(f"bubble model (p - 1) / (m + p - 1): {result['bubble_model']:.3f} of a step idle, "
          "1F1B and GPipe alike")
    for key in ("gpipe_vs_1f1b_step_time", "gpipe_vs_1f1b_peak_rss",
                "zs3_1f1b_vs_fsdp2_1f1b_throughput", "zs3_1f1b_vs_fsdp2_1f1b_peak_rss"):
        if key in result:
            print(f"{key}: {result[key]:.2f}x")


if __name__ == "__main__":
    main()
