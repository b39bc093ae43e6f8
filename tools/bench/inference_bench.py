#!/usr/bin/env python3
"""zs bench inference: a transformers Llama larger than the memory given to the device tier,
greedy generation of the same prompts by each peer in its own process, from the same
save_pretrained folder:

- zeroshard: init_inference with the weights on NVMe (offload_param nvme, max_in_cpu 0), the
  device holding the running unit and two read ahead;
- DeepSpeed ZeRO-Inference: stage 3 with offload_param nvme (max_in_cpu 0, its swap buffers
  of the largest tensor's size), the model built partitioned under HfDeepSpeedConfig as its
  zero-inference example does, with zeroshard's prefetch and live-parameter limits so both
  hold the same units on the device;
- accelerate: from_pretrained with device_map="auto", max_memory of the device budget and
  the rest offloaded to disk (offload_folder), as transformers loads a model that does not
  fit. It reads offloaded weights through the page cache (a memory map), which on this
  machine holds the whole file after the first pass, in RAM outside the process's RSS: so
  "accelerate" drops its files from the page cache before each forward (posix_fadvise), as a
  model larger than RAM forces, and "accelerate_warm" leaves them cached.

Prints tokens/s, load seconds and the growth of each process's peak RSS over its baseline
after imports, the ratios zeroshard / accelerate and zeroshard / DeepSpeed, whether the
tokens agree, and the NVMe read rate measured in the same run (O_DIRECT, 1 MiB blocks) with
the bound it sets on zeroshard (batch / (weights / rate) tokens/s) and the fraction reached
(the rate: zs-bench-io's sequential O_DIRECT reads at queue depth 32 in the same directory,
the faster of zeroshard's IoEngine and fio).
On a CPU machine the device tier is host RAM; zeroshard's and DeepSpeed's NVMe reads bypass
the page cache (O_DIRECT).
Run: ./zs bench inference [--json] [--layers N] [--hidden N] [--batch N] [--new-tokens N]
[--budget MiB] [--device cpu|cuda]."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PEERS = ("zeroshard", "deepspeed", "accelerate", "accelerate_warm")
PROMPT, VOCAB = 32, 8000


def model_config(args):
    import transformers
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64, tie_word_embeddings=False)


def make_folder(args, folder):
    import torch
    import transformers
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(model_config(args))
    model.save_pretrained(folder, max_shard_size="200MB")
    return sum(p.numel() for p in model.parameters())


def status():
    with open("/proc/self/status") as f:
        return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f
                if line.startswith(("VmRSS", "VmHWM"))}


def unit_numel(args):
    h, inner = args.hidden, args.hidden * 11 // 4
    return 4 * h * h + 3 * h * inner + 2 * h


def serve_zeroshard(args, folder, scratch):
    import zeroshard
    config = {"zero_optimization": {"stage": 3, "offload_param": {
        "device": "nvme", "nvme_path": scratch, "max_in_cpu": 0}}}
    engine = zeroshard.init_inference(folder, config=config)
    report = engine.memory_report()
    return engine.generate, {"nvme_weight_bytes": report["nvme"]["kinds"]["params"]["current"]}


def serve_deepspeed(args, folder, scratch):
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    os.environ.setdefault("LOCAL_SIZE", "1")
    import deepspeed
    import torch
    import transformers
    from transformers.integrations import HfDeepSpeedConfig
    deepspeed.init_distributed(dist_backend="gloo" if args.device == "cpu" else "nccl")
    unit = unit_numel(args)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "stage3_prefetch_bucket_size": 2 * unit, "stage3_max_live_parameters": 3 * unit,
        # Its swap buffers sized to the largest tensor (the embedding), not its default 1e8
        # elements (5 x 400 MB of fp32 staging for a model of this size).
        "offload_param": {"device": "nvme", "nvme_path": scratch, "pin_memory": False,
                          "max_in_cpu": 0, "buffer_size": VOCAB * args.hidden}}}
    keep = HfDeepSpeedConfig(config)  # noqa: F841 (from_pretrained builds under zero.Init)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    engine = deepspeed.initialize(model=model, config_params=config)[0]
    engine.module.eval()
    return engine.module.generate, {}


def serve_accelerate(args, folder, scratch):
    import torch
    import transformers
    device = 0 if args.device == "cuda" else "cpu"
    budget = {device: f"{args.budget}MiB"}
    if args.device == "cuda":
        budget["cpu"] = "0MiB"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, device_map="auto", max_memory=budget, offload_folder=scratch)
    placed = sorted({str(v) for v in model.hf_device_map.values()})
    if args.peer == "accelerate":
        # Before each forward the files its offloaded weights are read from (the folder's
        # safetensors, the offload folder) leave the page cache, as they could not stay
        # there with a model larger than RAM; "accelerate_warm" leaves them cached.
        files = [os.path.join(d, f) for d in (folder, scratch) for f in os.listdir(d)
                 if os.path.isfile(os.path.join(d, f))]
        model.register_forward_pre_hook(lambda *_: drop_from_page_cache(files))
    return model.generate, {"placement": placed}


def drop_from_page_cache(files):
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def peer(args):
    """One peer in this process: load, one warm-up generation, the timed one."""
    import torch
    torch.set_num_threads(args.threads)
    import transformers
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    if args.peer == "deepspeed":
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(args.port))
    # The baseline: after the peer's imports and a tiny model's generate (code paths loaded).
    __import__(args.peer.split("_")[0])
    tiny = transformers.LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2)
    transformers.LlamaForCausalLM(tiny).generate(torch.ones(1, 2, dtype=torch.long),
                                                 max_new_tokens=2, do_sample=False, pad_token_id=0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status()["VmRSS"]
    t0 = time.perf_counter()
    generate, extra = {"zeroshard": serve_zeroshard, "deepspeed": serve_deepspeed,
                       "accelerate": serve_accelerate, "accelerate_warm": serve_accelerate}[
                           args.peer](args, args.folder, args.scratch)
    load_s = time.perf_counter() - t0
    device = "cuda" if args.device == "cuda" else "cpu"
    prompts = torch.randint(3, VOCAB, (args.batch, PROMPT),
                            generator=torch.Generator().manual_seed(0)).to(device)
    kwargs = dict(attention_mask=torch.ones_like(prompts), do_sample=False, pad_token_id=0)
    with torch.no_grad():
        generate(prompts, max_new_tokens=2, **kwargs)
        t0 = time.perf_counter()
        tokens = generate(prompts, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                          **kwargs)
        seconds = time.perf_counter() - t0
    row = dict(extra, peer=args.peer, load_s=load_s, generate_s=seconds,
               tokens_per_s=args.batch * args.new_tokens / seconds,
               peak_rss_growth=status()["VmHWM"] - base,
               tokens=tokens[:, PROMPT:].tolist())
    with open(args.out, "w") as f:
        json.dump(row, f)


def nvme_read_rate(io_bench, scratch, size_mib):
    """The tier's read rate (bytes per second) as zs-bench-io measures it in the same
    directory: sequential O_DIRECT reads of a fresh file of the weights' size in 1 MiB
    blocks at queue depth 32, the faster of zeroshard's IoEngine and fio (the rate the
    tier can deliver, whoever reaches it)."""
    r = subprocess.run([io_bench, "--json", "--dir", scratch, "--size-mib", str(size_mib),
                        "--rounds", "2"], capture_output=True, text=True, timeout=600, check=True)
    measured = json.loads(r.stdout)
    return 1e9 * max(measured["read_gb_per_s"], measured.get("fio_read_gb_per_s") or 0)


def run_peer(name, args, folder, scratch):
    out = os.path.join(scratch, f"{name}.json")
    nvme = os.path.join(scratch, f"{name}-nvme")
    os.makedirs(nvme, exist_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--peer", name, "--folder", folder,
           "--scratch", nvme, "--out", out, "--batch", str(args.batch), "--new-tokens",
           str(args.new_tokens), "--budget", str(args.budget), "--device", args.device,
           "--layers", str(args.layers), "--hidden", str(args.hidden), "--threads",
           str(args.threads), "--port", str(args.port)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {"peer": name, "error": (r.stdout + r.stderr)[-2000:]}
    with open(out) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--budget", type=int, default=64, help="MiB given to the device tier")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--port", type=int, default=29650)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--io-bench", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "tools", "zs-bench-io"),
        help="zs-bench-io, which measures the tier's read rate")
    parser.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        return peer(args)
    with tempfile.TemporaryDirectory(prefix="zs-bench-inference-", dir=os.environ.get(
            "ZS_BENCH_NVME")) as scratch:
        folder = os.path.join(scratch, "model")
        params = make_folder(args, folder)
        rate = nvme_read_rate(args.io_bench, scratch, max(64, 4 * params >> 20))
        rows = {name: run_peer(name, args, folder, scratch) for name in args.peers.split(",")}
    result = {"model": f"Llama {args.layers} x {args.hidden}, {params} fp32 parameters",
              "weight_bytes": 4 * params, "device_budget_bytes": args.budget << 20,
              "batch": args.batch, "new_tokens": args.new_tokens, "device": args.device,
              "nvme_read_bytes_per_s": rate, "peers": rows}
    zs = rows.get("zeroshard", {})
    if "tokens_per_s" in zs:
        # Every forward reads every weight from NVMe: batch tokens per weights / rate.
        bound = args.batch / (zs["nvme_weight_bytes"] / rate)
        result["zeroshard_bound_tokens_per_s"] = bound
        result["zeroshard_fraction_of_bound"] = zs["tokens_per_s"] / bound
        for other in ("accelerate", "accelerate_warm", "deepspeed"):
            if "tokens_per_s" in rows.get(other, {}):
                result[f"zeroshard_vs_{other}_tokens_per_s"] = (zs["tokens_per_s"] /
                                                                rows[other]["tokens_per_s"])
                result[f"tokens_equal_{other}"] = zs["tokens"] == rows[other]["tokens"]
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{result['model']} ({result['weight_bytes'] / 2**20:.0f} MiB), device budget "
          f"{args.budget} MiB, batch {args.batch}, {args.new_tokens} new tokens, "
          f"NVMe reads {rate / 1e9:.2f} GB/s (zs-bench-io)")
    print(f"{'peer':<16} {'tokens/s':>9} {'load s':>7} {'peak RSS +MiB':>14}")
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<16} failed: {row['error'][-400:]}")
            continue
        print(f"{name:<16} {row['tokens_per_s']:>9.2f} {row['load_s']:>7.1f} "
              f"{row['peak_rss_growth'] / 2**20:>14.1f}")
    for key, value in result.items():
        if key.startswith(("zeroshard_", "tokens_equal")):
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
