#!/usr/bin/env python3
"""zs bench tp: tensor parallelism composed with sharding, TP2 x DP2 on 4 local ranks (Gloo,
one thread each), the same transformers Llama (from a config, seed 0), batches and AdamW:
zeroshard stage 3 given `tensor_parallel.autotp_size: 2` (the model's own tp_plan), against
FSDP2 + DTensor TP, torch's own composition (the same plan laid by transformers over mesh
"tp", then fully_shard per decoder layer and the root over mesh "dp", as torchtitan does).
Prints tokens/s and peak RSS as ratios, the final losses of both, and the bytes each
zeroshard rank sent per step. DeepSpeed's AutoTP with ZeRO-3 is not a row: it needs
DeepSpeed's CUDA path. Run: ./zs bench tp [--json] [--steps N]."""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

from local_ranks import run_ranks

WORLD, TP = 4, 2
SHAPE = dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
MICRO, SEQ, WARMUP = 4, 128, 2


def llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SHAPE))


def batch(step, dp_rank):
    import torch
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    return torch.randint(0, SHAPE["vocab_size"], (MICRO, SEQ), generator=g)


def worker(mode, steps, out):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dp_rank = rank // TP
    model = llama()
    sent = None
    if mode == "zeroshard":
        import zeroshard
        config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 1.0,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
                  "zero_optimization": {"stage": 3}, "tensor_parallel": {"autotp_size": TP}}
        engine, *_ = zeroshard.initialize(model=model, config=config)

        def step_once(tokens):
            loss = engine(input_ids=tokens, labels=tokens).loss
            engine.backward(loss)
            engine.step()
            return loss
        sent = engine._engine.bytes_sent
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism
        dist.init_process_group("gloo")
        with torch.no_grad():  # rank 0's weights everywhere, as zeroshard starts
            for t in model.parameters():
                dist.broadcast(t.data, 0)
        mesh = init_device_mesh("cpu", (WORLD // TP, TP), mesh_dim_names=("dp", "tp"))
        apply_tensor_parallelism(model, mesh["tp"])
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        # foreach=False: its fused lists cannot mix the two meshes either.
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, foreach=False)

        def step_once(tokens):
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            # Its parameters live on two meshes (dp x tp and dp), which clip_grad_norm_ cannot
            # stack: each norm made whole first, as torchtitan's own clipping does.
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            total = float(sum(g.norm().full_tensor() ** 2 for g in grads) ** 0.5)
            for g in grads:
                g.mul_(min(1.0, 1.0 / (total + 1e-6)))
            opt.step()
            opt.zero_grad()
            return loss
    losses, start, sent_start = [], None, 0
    for step in range(steps + WARMUP):
        if step == WARMUP:
            start, sent_start = time.perf_counter(), sent() if sent else 0
        losses.append(float(step_once(batch(step, dp_rank))))
    seconds = time.perf_counter() - start
    row = {"system": mode, "tokens_per_second": steps * MICRO * SEQ * (WORLD // TP) / seconds,
           "final_loss": losses[-1],
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if sent:
        row["bytes_sent_per_step"] = (sent() - sent_start) / steps
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(row, f)


def run(mode, steps, scratch):
    out = os.path.join(scratch, mode)
    rows, error = run_ranks(__file__, ["--worker", mode, str(steps), out], WORLD, out,
                            timeout=1800)
    if error:
        return {"system": mode, "error": error}
    row = dict(rows[0])
    row["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rows)
    if "bytes_sent_per_step" in row:
        row["bytes_sent_per_step"] = [r["bytes_sent_per_step"] for r in rows]
    return row


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        rows = [run(m, args.steps, scratch) for m in ("zeroshard", "fsdp2_tp")]
    result = {"rows": rows}
    zs, fsdp = rows
    if "error" not in zs and "error" not in fsdp:
        result["zs3_vs_fsdp2_tp_throughput"] = zs["tokens_per_second"] / fsdp["tokens_per_second"]
        result["zs3_vs_fsdp2_tp_peak_rss"] = zs["peak_rss_bytes"] / fsdp["peak_rss_bytes"]
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for r in rows:
        if "error" in r:
            print(f"{r['system']:>10}: failed: {r['error']}")
            continue
        extra = ""
        if "bytes_sent_per_step" in r:
            extra = "  sent/step per rank: " + ", ".join(
                f"{b / 2**20:.2f} MiB" for b in r["bytes_sent_per_step"])
        print(f"{r['system']:>10}: {r['tokens_per_second']:8.1f} tokens/s  peak RSS "
              f"{r['peak_rss_bytes'] / 2**20:7.1f} MiB  final loss {r['final_loss']:.5f}{extra}")
    for key in ("zs3_vs_fsdp2_tp_throughput", "zs3_vs_fsdp2_tp_peak_rss"):
        if key in result:
            print(f"{key}: {result[key]:.2f}x")


if __name__ == "__main__":
    main()
