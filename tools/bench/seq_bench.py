#!/usr/bin/env python3
"""zs bench seq: long sequences over 4 local ranks (Gloo, one thread each), one sequence a
step split across all of them, the same transformers Llama (from a config, seed 0, sdpa)
and AdamW, at growing lengths:
  zs_sp4     zeroshard stage 3, Ulysses (ALST's registration with transformers, SP=4)
  zs_sp4_offload  the same, each block recomputed in backward and its input kept on NVMe
             until then (activation_checkpointing: mode full, offload device nvme: what
             leaves RAM on this machine, where host RAM is the device)
  ds_sp4     DeepSpeed 0.19.8 stage 3, the same Ulysses path (its own register_with_transformers)
  zs_cp4     zeroshard stage 3, torch's ring attention (context_parallel over mesh "cp")
  fsdp2_cp4  FSDP2 (fully_shard per decoder layer and the root) + the same torch ring, as
             torchtitan composes them (torch's ring dispatches CUDA kernels only: on CPU
             ranks it runs with the sdpa CPU kernel zeroshard registers for it)
Each length runs 1 warm-up step and --steps timed ones; a system stops growing once a rank's
peak RSS passes --budget-gib. Prints tokens/s and peak RSS per rank at every length, the
longest length within the budget, and zeroshard's ratios against the peer on the same path
(zs_sp4 / ds_sp4, zs_cp4 / fsdp2_cp4, zs_sp4_offload / zs_sp4) at the longest length both
ran, and the longest lengths' ratio.
Run: ./zs bench seq [--json] [--lengths 4096,8192,16384] [--steps N] [--budget-gib G]
[--systems zs_sp4,zs_sp4_offload,ds_sp4,zs_cp4,fsdp2_cp4]."""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

from local_ranks import run_ranks

WORLD = 4
SHAPE = dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1 << 17)
SYSTEMS = ("zs_sp4", "zs_sp4_offload", "ds_sp4", "zs_cp4", "fsdp2_cp4")
PAIRS = (("zs_sp4", "ds_sp4"), ("zs_cp4", "fsdp2_cp4"), ("zs_sp4_offload", "zs_sp4"))
LR = 1e-4


def llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(LlamaConfig(**SHAPE), attn_implementation="sdpa")


def sample(step, length):
    """One sequence a step: its ids, position ids and labels shifted before any slicing."""
    import torch
    import torch.nn.functional as F
    ids = torch.randint(0, SHAPE["vocab_size"], (1, length),
                        generator=torch.Generator().manual_seed(step))
    return ids, torch.arange(length)[None], F.pad(ids, (0, 1), value=-100)[:, 1:].contiguous()


def share_loss(logits, shift_labels, tokens):
    """This rank's tokens' loss sum over the whole sequence's token count."""
    import torch.nn.functional as F
    return F.cross_entropy(logits.float().flatten(0, 1), shift_labels.flatten(),
                           ignore_index=-100, reduction="sum") / tokens


def ulysses(package, length, offload=None):
    """zs_sp4 / ds_sp4: (step function) with the package's ALST path at stage 3; `offload`:
    a folder for zs_sp4_offload's swap file."""
    import importlib
    ds = importlib.import_module(package)
    sp = importlib.import_module(f"{package}.runtime.sequence_parallel.ulysses_sp")
    ds.init_distributed(dist_backend="gloo")
    model = llama()
    mpu = sp.UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=WORLD,
        micro_batch_size=1, seq_length=length, seq_length_is_variable=True)
    config = {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": WORLD,
              "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}
    if offload:
        config["activation_checkpointing"] = {
            "mode": "full", "offload": {"device": "nvme", "nvme_path": offload}}
    engine, *_ = ds.initialize(config=config, model=model, model_parameters=model.parameters(),
                               mpu=mpu)
    rank, part = int(os.environ["RANK"]), length // WORLD
    here = slice(rank * part, (rank + 1) * part)

    def step_once(step):
        ids, positions, labels = sample(step, length)
        tokens = (labels != -100).sum()
        logits = engine(input_ids=ids[:, here], position_ids=positions[:, here]).logits
        engine.backward(share_loss(logits, labels[:, here], tokens))
        engine.step()
    return step_once


def ring(system, length):
    """zs_cp4 / fsdp2_cp4: (step function) with torch's context_parallel over all ranks."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    import zeroshard
    zeroshard.init_distributed(dist_backend="gloo")
    mesh = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("dp", "cp"))
    model = llama()
    if system == "zs_cp4":
        config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
                  "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}
        engine, *_ = zeroshard.initialize(model=model, config=config, mesh=mesh)
        forward, backward, update = engine, engine.backward, engine.step
    else:
        from torch.distributed.fsdp import fully_shard
        from zeroshard._sequence.context_parallel import enable_cpu_ring_attention
        enable_cpu_ring_attention()
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["cp"])
        fully_shard(model, mesh=mesh["cp"])
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        forward, backward = model, lambda loss: loss.backward()

        def update():
            opt.step()
            opt.zero_grad()

    def step_once(step):
        ids, positions, labels = sample(step, length)
        tokens = (labels != -100).sum()
        buffers = [ids, positions, labels]
        with context_parallel(mesh["cp"], buffers=buffers, buffer_seq_dims=[1, 1, 1],
                              no_restore_buffers=set(buffers)):
            logits = forward(input_ids=ids, position_ids=positions).logits
            backward(share_loss(logits, labels, tokens))
        update()
    return step_once


def worker(system, length, steps, out):
    import torch
    torch.set_num_threads(1)
    if system == "zs_sp4_offload":
        step_once = ulysses("zeroshard", length, offload=f"{out}.swap")
    elif system.endswith("sp4"):
        step_once = ulysses("zeroshard" if system == "zs_sp4" else "deepspeed", length)
    else:
        step_once = ring(system, length)
    step_once(0)  # warm-up
    start = time.perf_counter()
    for step in range(1, steps + 1):
        step_once(step)
    seconds = time.perf_counter() - start
    row = {"tokens_per_second": steps * length / seconds,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(row, f)


def run(system, length, steps, scratch):
    out = os.path.join(scratch, f"{system}_{length}")
    rows, error = run_ranks(__file__, ["--worker", system, str(length), str(steps), out], WORLD,
                            out, timeout=3600)
    if error:
        return {"length": length, "error": error}
    return {"length": length, "tokens_per_second": rows[0]["tokens_per_second"],
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rows)}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,8192,16384")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--budget-gib", type=float, default=2.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    budget = args.budget_gib * 2**30
    result = {"lengths": lengths, "budget_bytes_per_rank": budget, "systems": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for system in args.systems.split(","):
            rows = []
            for length in lengths:
                rows.append(run(system, length, args.steps, scratch))
                if "error" in rows[-1] or rows[-1]["peak_rss_bytes"] > budget:
                    break
            within = [r["length"] for r in rows
                      if "error" not in r and r["peak_rss_bytes"] <= budget]
            result["systems"][system] = {"rows": rows,
                                         "longest_within_budget": max(within, default=0)}
    for ours, peer in PAIRS:
        if ours not in result["systems"] or peer not in result["systems"]:
            continue
        mine = {r["length"]: r for r in result["systems"][ours]["rows"] if "error" not in r}
        theirs = {r["length"]: r for r in result["systems"][peer]["rows"] if "error" not in r}
        common = sorted(set(mine) & set(theirs))
        if common:
            n = common[-1]
            result[f"{ours}_vs_{peer}"] = {
                "length": n,
                "throughput": mine[n]["tokens_per_second"] / theirs[n]["tokens_per_second"],
                "peak_rss": mine[n]["peak_rss_bytes"] / theirs[n]["peak_rss_bytes"],
                "longest": result["systems"][ours]["longest_within_budget"] /
                max(1, result["systems"][peer]["longest_within_budget"])}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for system, s in result["systems"].items():
        for r in s["rows"]:
            if "error" in r:
                print(f"{system:>14} {r['length']:>7}: failed: {r['error'][-600:]}")
                continue
            print(f"{system:>14} {r['length']:>7} tokens: {r['tokens_per_second']:8.1f} tokens/s  "
                  f"peak RSS {r['peak_rss_bytes'] / 2**20:7.1f} MiB/rank")
        print(f"{system:>14} longest within {args.budget_gib:g} GiB/rank: "
              f"{s['longest_within_budget']} tokens")
    for ours, peer in PAIRS:
        key = f"{ours}_vs_{peer}"
        if key in result:
            r = result[key]
            print(f"{key} at {r['length']} tokens: throughput {r['throughput']:.2f}x, "
                  f"peak RSS {r['peak_rss']:.2f}x; longest within the budget {r['longest']:.2f}x")


if __name__ == "__main__":
    main()
