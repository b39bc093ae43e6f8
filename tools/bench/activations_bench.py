#!/usr/bin/env python3
"""zs bench activations: the activation policies of one rank (its own process per system and
length), the same transformers Llama (from a config, seed 0, sdpa, fp32) and
AdamW, one sequence a step, 2 intra-op threads each, at growing lengths:
  torch              the model and torch.optim.AdamW, nothing recomputed
  torch_checkpoint   the same with the model's gradient_checkpointing_enable() (torch's
                     non-reentrant checkpoint around every layer)
  torch_save_on_cpu  the same inside torch.autograd.graph.save_on_cpu()
  zs_none, zs_full, zs_op      zeroshard stage 2 with activation_checkpointing.mode none, full,
                               selective (op)
  zs_cpu, zs_full_cpu          ... with offload.device cpu (mode none, full)
  zs_nvme, zs_full_nvme        ... with offload.device nvme (mode none, full), in --nvme-dir
Each runs 1 warm-up step and --steps timed ones, then one forward under torch's profiler:
the bytes it leaves alive in torch's allocator (what a GPU would hold for backward; the
offload's host blocks are allocated beside it and counted by the ledger instead). A system
stops growing once its peak RSS passes --budget-gib (every row with glibc's mmap threshold
fixed at 128 KiB and zeroshard's ZS_MALLOC_KEEP=0, so memory freed leaves the process).
Prints seconds per step, peak RSS,
forward-kept bytes and the ledger's host/NVMe activations at every length; the longest
length within the budget; and, at the longest length every system ran, each zeroshard row
against its torch peer (zs_none, zs_cpu, zs_nvme / torch; zs_full, zs_full_cpu, zs_full_nvme /
torch_checkpoint; zs_cpu / torch_save_on_cpu) as ratios of step time and forward-kept bytes.
On this machine the "device" is host RAM: offload to cpu moves bytes within the same memory
(its RSS does not fall); offload to NVMe takes them out of it.
Run: ./zs bench activations [--json] [--lengths 2048,4096,8192,16384] [--steps N]
[--budget-gib G] [--systems ...] [--nvme-dir DIR]."""
import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time

from local_ranks import run_ranks

SHAPE = dict(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1 << 17)
SYSTEMS = ("torch", "torch_checkpoint", "torch_save_on_cpu", "zs_none", "zs_full", "zs_op",
           "zs_cpu", "zs_full_cpu", "zs_nvme", "zs_full_nvme")
PEERS = {"zs_none": "torch", "zs_cpu": "torch", "zs_nvme": "torch",
         "zs_full": "torch_checkpoint", "zs_full_cpu": "torch_checkpoint",
         "zs_full_nvme": "torch_checkpoint", "zs_op": "torch_checkpoint"}
LR = 1e-4
THREADS = 2
# Every row's allocations of 128 KiB or more are mapped and unmapped one by one (glibc's
# mmap threshold fixed, where by default it rises after the first large free; zeroshard's
# engine keeps freed memory without offload, ZS_MALLOC_KEEP=0 turns that off): memory a row
# frees leaves the process, so peak RSS shows what each row holds at once.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 << 10), "ZS_MALLOC_KEEP": "0"}


def llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(LlamaConfig(**SHAPE), attn_implementation="sdpa")


def policy(system, nvme_dir):
    """The activation_checkpointing section of a zeroshard row."""
    name = system[len("zs_"):]
    mode = {"none": "none", "op": "selective", "cpu": "none", "nvme": "none"}.get(name, "full")
    section = {"mode": mode}
    if name == "op":
        section["selective_ac_option"] = "op"
    for device in ("cpu", "nvme"):
        if name.endswith(device):
            section["offload"] = {"device": device}
            if device == "nvme":
                section["offload"]["nvme_path"] = nvme_dir
    return section


def stepper(system, nvme_dir):
    """(forward(ids) -> loss, finish(loss): backward and step, ledger()) for the system:
    ledger() gives the host and NVMe activations' peaks (zeroshard's rows) or None."""
    import contextlib
    import torch
    model = llama()
    if system.startswith("zs_"):
        import zeroshard
        zeroshard.init_distributed(dist_backend="gloo")
        engine = zeroshard.initialize(model=model, config={
            "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
            "activation_checkpointing": policy(system, nvme_dir),
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}})[0]

        def forward(ids):
            return engine(input_ids=ids, labels=ids).loss

        def finish(loss):
            engine.backward(loss)
            engine.step()

        def ledger():
            report = engine.memory_report()
            return {tier: report[tier]["kinds"]["activations"]["peak"] for tier in ("host", "nvme")}
        return forward, finish, ledger
    if system == "torch_checkpoint":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    around = torch.autograd.graph.save_on_cpu if system == "torch_save_on_cpu" else \
        contextlib.nullcontext

    def forward(ids):
        with around():
            return model(input_ids=ids, labels=ids).loss

    def finish(loss):
        loss.backward()
        opt.step()
        opt.zero_grad()
    return forward, finish, lambda: None


def forward_kept(forward, finish, ids):
    """Bytes one forward leaves alive in torch's allocator (its backward is run after)."""
    import torch
    gc.collect()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        loss = forward(ids)
    finish(loss)
    return sum(e.self_cpu_memory_usage for e in prof.key_averages())


def worker(system, length, steps, nvme_dir, out):
    import statistics
    import torch
    os.environ["ZS_NUM_THREADS"] = str(THREADS)  # the engine's intra-op threads, as torch's
    torch.set_num_threads(THREADS)
    forward, finish, ledger = stepper(system, nvme_dir)

    def step(ids):
        finish(forward(ids))

    def batch(n):
        return torch.randint(0, SHAPE["vocab_size"], (1, length),
                             generator=torch.Generator().manual_seed(n))
    step(batch(0))  # warm-up
    times = []
    for n in range(1, steps + 1):
        ids = batch(n)
        start = time.perf_counter()
        step(ids)
        times.append(time.perf_counter() - start)
    row = {"seconds_per_step": statistics.median(times),
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "ledger": ledger()}
    row["forward_kept_bytes"] = forward_kept(forward, finish, batch(steps + 1))
    with open(f"{out}.rank0.json", "w") as f:
        json.dump(row, f)


def run(system, length, steps, nvme_dir, scratch):
    out = os.path.join(scratch, f"{system}_{length}")
    rows, error = run_ranks(__file__, ["--worker", system, str(length), str(steps), nvme_dir, out],
                            1, out, timeout=3600)
    return {"length": length, "error": error} if error else dict(rows[0], length=length)


def compare(result):
    """At the longest length every compared pair ran: zeroshard over its torch peer."""
    ran = {s: {r["length"]: r for r in v["rows"] if "error" not in r}
           for s, v in result["systems"].items()}
    pairs = [(ours, peer) for ours, peer in PEERS.items() if ours in ran and peer in ran]
    pairs += [("zs_cpu", "torch_save_on_cpu")] if {"zs_cpu", "torch_save_on_cpu"} <= set(ran) \
        else []
    common = set.intersection(*(set(ran[s]) for pair in pairs for s in pair)) if pairs else set()
    if not common:
        return
    n = max(common)
    result["compared_at"] = n
    result["ratios"] = {
        f"{ours}/{peer}": {
            "step_time": ran[ours][n]["seconds_per_step"] / ran[peer][n]["seconds_per_step"],
            "forward_kept": ran[ours][n]["forward_kept_bytes"] / ran[peer][n]["forward_kept_bytes"]}
        for ours, peer in pairs}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,4096,8192,16384")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--budget-gib", type=float, default=2.5)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--nvme-dir", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.update(MALLOC_ENV)  # the rows' processes inherit it
    lengths = [int(n) for n in args.lengths.split(",")]
    budget = args.budget_gib * 2**30
    result = {"lengths": lengths, "budget_bytes": budget, "systems": {}}
    with tempfile.TemporaryDirectory() as scratch:
        nvme_dir = args.nvme_dir or os.path.join(scratch, "nvme")
        for system in args.systems.split(","):
            rows = []
            for length in lengths:
                rows.append(run(system, length, args.steps, nvme_dir, scratch))
                if "error" in rows[-1] or rows[-1]["peak_rss_bytes"] > budget:
                    break
            within = [r["length"] for r in rows
                      if "error" not in r and r["peak_rss_bytes"] <= budget]
            result["systems"][system] = {"rows": rows,
                                         "longest_within_budget": max(within, default=0)}
    compare(result)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    mib = 2**20
    for system, s in result["systems"].items():
        for r in s["rows"]:
            if "error" in r:
                print(f"{system:>17} {r['length']:>6}: failed: {r['error'][-600:]}")
                continue
            held = r["ledger"] or {}
            print(f"{system:>17} {r['length']:>6} tokens: {r['seconds_per_step']:6.2f} s/step  "
                  f"peak RSS {r['peak_rss_bytes'] / mib:7.1f} MiB  forward kept "
                  f"{r['forward_kept_bytes'] / mib:7.1f} MiB  host {held.get('host', 0) / mib:6.1f}"
                  f" MiB  nvme {held.get('nvme', 0) / mib:6.1f} MiB")
        print(f"{system:>17} longest within {args.budget_gib:g} GiB: "
              f"{s['longest_within_budget']} tokens")
    for key, r in result.get("ratios", {}).items():
        print(f"{key} at {result['compared_at']} tokens: step time {r['step_time']:.2f}x, "
              f"forward kept {r['forward_kept']:.2f}x")


if __name__ == "__main__":
    main()
