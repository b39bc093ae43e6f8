#!/usr/bin/env python3
"""zs bench moe: a Qwen3-MoE-shaped transformers model (from a config, seed 0, sdpa; 8
experts, top 2) trained on 4 local ranks (Gloo, one thread each), each rank its own sample
per step, the same AdamW:
  zs_ep2     zeroshard stage 3 with the experts split over 2 ranks (AutoEP, EP2 x DP2):
             each expert's parameters sharded over the 2 ranks holding it, tokens sent to
             them and back (a dropless all-to-all each way, per MoE layer), a rank's
             experts in one grouped GEMM (torch's grouped_mm, AutoEP's use_grouped_mm)
  zs_ep2_loop  the same with use_grouped_mm false: a loop of matmuls per expert
  zs_stage3  zeroshard stage 3, every expert sharded over all 4 ranks (no EP)
  fsdp2      FSDP2 (fully_shard per decoder layer and the root, as torchtitan composes it),
             without EP: torch has no expert-parallel composition that runs on CPU ranks
             (torchtitan's dispatch is CUDA kernels)
Each runs 1 warm-up step and --steps timed ones. Prints tokens/s (all ranks' tokens) and
the peak RSS of the largest rank for each, and zs_ep2's ratios against fsdp2, zs_stage3
and zs_ep2_loop measured in the same run.
Run: ./zs bench moe [--json] [--steps N] [--seq N]
                    [--systems zs_ep2,zs_ep2_loop,zs_stage3,fsdp2]."""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

from local_ranks import run_ranks

WORLD, EP = 4, 2
SHAPE = dict(vocab_size=8000, hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, num_experts=8,
             num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=8192)
SYSTEMS = ("zs_ep2", "zs_ep2_loop", "zs_stage3", "fsdp2")
PEERS = ("fsdp2", "zs_stage3", "zs_ep2_loop")
LR = 1e-4


def qwen3_moe():
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM._from_config(Qwen3MoeConfig(**SHAPE), attn_implementation="sdpa")


def prepare(system):
    """(forward, backward, update) for `system` on this rank."""
    import torch
    model = qwen3_moe()
    if system == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("gloo")
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

        def update():
            opt.step()
            opt.zero_grad()
        return model, lambda loss: loss.backward(), update
    import zeroshard
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}
    if system.startswith("zs_ep2"):
        config["expert_parallel"] = {"enabled": True, "autoep_size": EP,
                                     "use_grouped_mm": system == "zs_ep2"}
    engine, *_ = zeroshard.initialize(model=model, config=config)
    return engine, engine.backward, engine.step


def worker(system, seq, steps, out):
    import torch
    torch.set_num_threads(1)
    forward, backward, update = prepare(system)
    rank = int(os.environ["RANK"])

    def step_once(step):
        ids = torch.randint(0, SHAPE["vocab_size"], (1, seq),
                            generator=torch.Generator().manual_seed(step * WORLD + rank))
        backward(forward(input_ids=ids, labels=ids).loss)
        update()

    step_once(0)  # warm-up
    start = time.perf_counter()
    for step in range(1, steps + 1):
        step_once(step)
    seconds = time.perf_counter() - start
    row = {"tokens_per_second": WORLD * steps * seq / seconds,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(row, f)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {"seq": args.seq, "steps": args.steps, "ranks": WORLD, "systems": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for system in args.systems.split(","):
            out = os.path.join(scratch, system)
            rows, error = run_ranks(__file__, ["--worker", system, str(args.seq), str(args.steps),
                                               out], WORLD, out, timeout=3600)
            result["systems"][system] = ({"error": error} if error else {
                "tokens_per_second": min(r["tokens_per_second"] for r in rows),
                "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rows)})
    ours = result["systems"].get("zs_ep2", {})
    for peer in PEERS:
        theirs = result["systems"].get(peer, {})
        if "tokens_per_second" in ours and "tokens_per_second" in theirs:
            result[f"zs_ep2_vs_{peer}"] = {
                "throughput": ours["tokens_per_second"] / theirs["tokens_per_second"],
                "peak_rss": ours["peak_rss_bytes"] / theirs["peak_rss_bytes"]}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for system, r in result["systems"].items():
        if "error" in r:
            print(f"{system:>11}: failed: {r['error'][-600:]}")
            continue
        print(f"{system:>11}: {r['tokens_per_second']:8.1f} tokens/s  "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:7.1f} MiB/rank")
    for peer in PEERS:
        key = f"zs_ep2_vs_{peer}"
        if key in result:
            print(f"{key}: throughput {result[key]['throughput']:.2f}x, "
                  f"peak RSS {result[key]['peak_rss']:.2f}x")


if __name__ == "__main__":
    main()
