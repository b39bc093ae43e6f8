#!/usr/bin/env python3
"""zs bench gpu: a Llama-shaped model on one GPU with its optimizer state in host memory,
three ways, in one run: zeroshard ZeRO-3 + `offload_optimizer: cpu` (its step inside
backward, `overlap_step`), torch FSDP2 `fully_shard` + `CPUOffloadPolicy`, and DeepSpeed
ZeRO-3 + `offload_optimizer: cpu`. Same model (Hugging Face `LlamaForCausalLM` from a
config, random weights from one seed), bf16 compute with fp32 master weights and Adam
state, AdamW with the same settings, no clipping (for all three), the same tokens.

Each row: tokens/s, TFLOP/s (6 x parameters + 12 x layers x hidden x sequence, per
token), peak GPU memory (torch.cuda.max_memory_allocated), peak host RSS, final loss, and
the median forward, backward and step (optimizer and copies back) times, so a shortfall
names its phase. A row that cannot run keeps its row with the reason.

`--search`: the largest model each of the three steps on this machine, by layers at the
shape's width (each try a fresh process, two steps; on a GPU from the layers zeroshard's
plan says fit, stepping by about 6%, so that a row takes a few tries). Every row's tries
recompute each layer's activations in backward (Hugging Face's gradient checkpointing),
as one training the largest model it can would, unless --checkpointing off; their
weights are one value per matrix (filled in a second, where drawing them takes minutes).
There zeroshard's row keeps on the GPU as much of the optimizer as the planner says fits
beside the parameters and activations (offload_optimizer.ratio, as zeroshard-estimate
plans it), and steps the rest on the host; the peers keep their defaults (every shard's
Adam on the host: DeepSpeed's own `ratio` is left at 1, as its users must pick a value
by hand; --deepspeed-ratio planned gives it the ratio zeroshard plans, to tell how much
of the gain the split alone makes).
`--device cpu --shape tiny`: the same code on the CPU, where no GPU is, to check the
script itself; no target is judged there.

usage: ./zs bench gpu [--json] [--shape 1b|tiny] [--layers N] [--seq N] [--batch N]
                      [--steps N] [--rows a,b] [--search | --search-only] [--device cuda|cpu]
                      [--checkpointing search|on|off] [--deepspeed-ratio 1|planned]
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

LR, WEIGHT_DECAY = 1e-4, 0.01
SHAPES = {  # LlamaConfig values; 1b is TinyLlama-1.1B's shape
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=512),
}
ROWS = ["zeroshard_z3_offload_cpu", "fsdp2_cpu_offload", "deepspeed_z3_offload_cpu"]
# (key, ours, peer, target): the tokens/s ratios the GPU targets ask for
RATIOS = [("zs_vs_fsdp2_cpu_offload_throughput", ROWS[0], ROWS[1], 1.5),
          ("zs_vs_deepspeed_offload_throughput", ROWS[0], ROWS[2], 1.2)]
LARGEST_TARGET = 1.3  # zeroshard's largest model over the largest of the peers'


# ---------------------------------------------------------------- one row, one process

def llama_config(args, layers):
    import transformers
    shape = dict(SHAPES[args.shape], num_hidden_layers=layers)
    return transformers.LlamaConfig(max_position_embeddings=args.seq, tie_word_embeddings=False,
                                    use_cache=False, **shape)  # training: no KV cache


def build_model(args, layers, torch):
    """fp32 on the CPU from seed 0: the same weights for every row. A search's try
    (--fast-init) fills each matrix with one value instead: transformers' initialisation
    draws its normals on one core (about 120 M a second), minutes for a model of ten
    billion parameters, and whether a model fits does not depend on its values."""
    import transformers
    torch.manual_seed(0)
    if not args.fast_init:
        model = transformers.LlamaForCausalLM(llama_config(args, layers))
    else:
        with no_init_weights():
            model = transformers.LlamaForCausalLM(llama_config(args, layers))
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:  # the norms' weights are ones from their constructor
                    p.fill_(0.02)
    if args.checkpointing == "on":  # every row alike: each layer recomputed in backward
        model.gradient_checkpointing_enable()
    return model


def no_init_weights():
    try:
        from transformers.initialization import no_init_weights as skip
    except ImportError:  # transformers before 5
        from transformers.modeling_utils import no_init_weights as skip
    return skip()


def zeroshard_row(args, model, torch, device):
    import zeroshard
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
        "zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "cpu", "overlap_step": "auto",
                                                    "ratio": planned_ratio(args, model, torch)}},
    }
    model.to(device=device, dtype=torch.bfloat16)
    engine, *_ = zeroshard.initialize(model=model, config=config)
    return engine, engine.backward, engine.step


def planned_ratio(args, model, torch):
    """offload_optimizer.ratio: 1 (every shard's Adam on the host, the throughput rows), or
    with --ratio auto (the search) as zeroshard-estimate plans it before launch for this
    model, batch and device: as much of the optimizer on the GPU as its memory holds beside
    the parameters and this batch's activations, the rest on the host."""
    if args.ratio != "auto":
        args.planned_ratio = float(args.ratio)
        return args.planned_ratio
    return plan_ratio(args, model, torch)


def plan_ratio(args, model, torch):
    """The ratio zeroshard-estimate plans for this model, batch and device (recorded in
    the row's JSON)."""
    import yaml
    import zeroshard
    config = {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": args.batch,
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
                                                                       "ratio": "auto"}}}
    gpu = (torch.cuda.get_device_properties(0).total_memory if args.device == "cuda"
           else 4 * 2**20)  # the script's CPU check: a device too small for all of it
    plan = zeroshard.estimate(model, config, gpu_memory=gpu, seq=args.seq,
                              micro_batch=args.batch)
    ratio = yaml.safe_load(plan["config_yaml"])["zero_optimization"]["offload_optimizer"]["ratio"]
    print(f"planned offload_optimizer.ratio: {ratio} ({plan['summary']})", flush=True)
    args.planned_ratio = float(ratio)
    return args.planned_ratio


def deepspeed_ratio(args, model, torch):
    """DeepSpeed's offload_optimizer.ratio (its ZeRO-Offload++): 1, its default, or with
    --deepspeed-ratio planned the ratio zeroshard plans for this model and batch, as a
    DeepSpeed user who copied it from zeroshard-estimate would set it: how much of
    zeroshard's larger model the split alone gives."""
    return plan_ratio(args, model, torch) if args.deepspeed_ratio == "planned" else 1.0


def fsdp2_row(args, model, torch, device):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    mesh = init_device_mesh(device.type, (1,))
    # Page-locked host memory needs a GPU's driver; without one (the script's CPU check)
    # the policy keeps pageable memory.
    kwargs = dict(mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda"),
                  mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                 reduce_dtype=torch.float32))
    for layer in model.model.layers:  # as FSDP2's docs and torchtitan wrap a transformer
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def step():
        opt.step()
        opt.zero_grad()

    return model, lambda loss: loss.backward(), step


def deepspeed_row(args, model, torch, device):
    import deepspeed
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
        "zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "cpu",
                                                    "pin_memory": device.type == "cuda",
                                                    "ratio": deepspeed_ratio(args, model, torch)}},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    return engine, engine.backward, engine.step


TRAINERS = dict(zip(ROWS, (zeroshard_row, fsdp2_row, deepspeed_row)))


def flops_per_token(config, params):
    return 6 * params + 12 * config.num_hidden_layers * config.hidden_size * \
        config.max_position_embeddings


def worker(args):
    if args.device == "cpu" and args.worker.startswith("deepspeed"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    layers = args.layers or SHAPES[args.shape]["num_hidden_layers"]
    model = build_model(args, layers, torch)
    params = sum(p.numel() for p in model.parameters())
    model, backward, step = TRAINERS[args.worker](args, model, torch, device)
    gen = torch.Generator().manual_seed(100)
    vocab = SHAPES[args.shape]["vocab_size"]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    phases = {"forward": [], "backward": [], "step": []}
    loss = None
    for i in range(args.warmup + args.steps):
        ids = torch.randint(vocab, (args.batch, args.seq), generator=gen).to(device)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        sync()
        t1 = time.perf_counter()
        backward(loss)
        sync()
        t2 = time.perf_counter()
        step()
        sync()
        t3 = time.perf_counter()
        if i >= args.warmup:
            for name, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
                phases[name].append(seconds)
    # zeroshard's plan beside what torch's allocator really held (the Planner's check): the
    # engine's model states for this model and config, and the activations of this batch
    plan = model.memory_report()["device"] if hasattr(model, "memory_report") else None
    median = {k: statistics.median(v) for k, v in phases.items()}
    step_seconds = sum(median.values())
    tokens = args.batch * args.seq / step_seconds
    with open(args.out, "w") as f:
        json.dump({
            "system": args.worker, "layers": layers, "parameters": params,
            "checkpointing": args.checkpointing == "on",
            "tokens_per_second": tokens,
            "tflops": tokens * flops_per_token(llama_config(args, layers), params) / 1e12,
            "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "final_loss": loss.item(), "phase_seconds": median,
            **({"offload_ratio": args.planned_ratio} if hasattr(args, "planned_ratio") else {}),
            **({"planned_device_bytes": plan["predicted"],
                "planned_activation_bytes": plan["kinds"]["activations"]["predicted"],
                "ledger_device_peak": plan["peak"]} if plan else {}),
        }, f)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- the driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_lines(printed, n=6):
    return " | ".join(printed.strip().splitlines()[-n:])


def run_row(args, row, layers, steps, warmup, timeout, ratio="1", search=False):
    """One row in a fresh process: its measurements, or {"error": what it printed}. A
    search's try fills its weights fast and recomputes activations unless
    --checkpointing off; the throughput rows only with --checkpointing on."""
    checkpointing = checkpointed(args, search)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", row, "--out", out,
               "--shape", args.shape, "--layers", str(layers), "--seq", str(args.seq),
               "--batch", str(args.batch), "--steps", str(steps), "--warmup", str(warmup),
               "--device", args.device, "--ratio", ratio, "--checkpointing", checkpointing,
               "--deepspeed-ratio", args.deepspeed_ratio] + \
            (["--fast-init"] if search else [])
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            printed = (e.stdout or b"").decode(errors="replace") + \
                (e.stderr or b"").decode(errors="replace")
            return {"system": row, "layers": layers,
                    "error": f"still running after {timeout} s: " + last_lines(printed)}
        if p.returncode != 0 or not os.path.exists(out):
            return {"system": row, "layers": layers,
                    "error": f"exit {p.returncode}: " + last_lines(p.stdout + p.stderr)}
        with open(out) as f:
            return json.load(f)


def checkpointed(args, search):
    """--checkpointing for one run: on or off ("search": on in the search's tries only)."""
    return "on" if args.checkpointing == "on" or (search and args.checkpointing == "search") \
        else "off"


def planned_layers(args, ratio):
    """The most layers zeroshard's plan says fit on this machine at offload_optimizer.ratio
    `ratio` (1, or auto), counted on the meta device: where the search starts. With ratio 1
    every row keeps about 16 bytes a parameter in host RAM, so it is the peers' start too."""
    import torch
    import transformers
    import yaml
    import zeroshard
    gpu = torch.cuda.get_device_properties(0).total_memory
    config = {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": args.batch,
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
                                                                       "ratio": ratio}}}

    def fits(layers):
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(llama_config(args, layers))
        plan = zeroshard.estimate(model, config, gpu_memory=gpu, seq=args.seq,
                                  micro_batch=args.batch,
                                  activation_checkpointing=checkpointed(args, True) == "on")
        return plan["fits"]

    good, bad = 0, 1024  # 1024 layers of the 1b shape: 45 B parameters
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def largest(args, row):
    """The most layers `row` steps twice, to within about 6%: on a GPU from where the plan
    says (planned_layers), stepping up (6%, then twice each step) while it fits, then
    bisecting, or bisecting below the plan's where that did not fit;
    on the CPU (the script's check) doubling from the shape's, then bisecting."""
    def fits(layers):  # each try said as it ends: a search cut short still tells
        # zeroshard's row keeps on the GPU what the planner says fits there (planned_ratio).
        start = time.perf_counter()
        got = run_row(args, row, layers, 2, 0, args.search_timeout, ratio="auto", search=True)
        ratio = f", offload_optimizer.ratio {got['offload_ratio']:.3f}" \
            if "offload_ratio" in got else ""
        print(f"{row}: {layers} layers: " +
              (f"stepped{ratio}" if "error" not in got else f"did not: {got['error'][-300:]}") +
              f" ({time.perf_counter() - start:.0f} s)", flush=True)
        return "error" not in got
    if args.device == "cuda":
        split = row == ROWS[0] or (row == ROWS[2] and args.deepspeed_ratio == "planned")
        guess = max(1, planned_layers(args, "auto" if split else 1))
        step = max(1, guess // 16)
        print(f"{row}: the plan's largest {guess} layers; trying from there", flush=True)
        if fits(guess):
            good, bad, up = guess, guess + step, step
            while fits(bad):  # each step up twice the last: a plan far too cautious costs
                up *= 2       # a few tries, not one per 6%
                good, bad = bad, bad + up
        else:
            good, bad = 0, guess
    else:
        good, bad = 0, SHAPES[args.shape]["num_hidden_layers"]
        while fits(bad):
            good, bad = bad, bad * 2
        step = 1
    while bad - good > max(1, step, good // 16):
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    if good == 0:
        return {"system": row, "layers": 0, "parameters": 0}
    config = llama_config(args, good)
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = h * config.num_key_value_heads // config.num_attention_heads
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return {"system": row, "layers": good, "parameters": good * per_layer + 2 * v * h + h}


def gib(b):
    return "-" if b is None else f"{b / 2**30:.2f}"


def print_rows(rows):
    print(f"{'system':<26} {'tokens/s':>9} {'TFLOP/s':>8} {'GPU GiB':>8} {'RSS GiB':>8} "
          f"{'fwd ms':>8} {'bwd ms':>8} {'step ms':>8} {'loss':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['system']:<26} could not run: {r['error']}")
            continue
        ph = r["phase_seconds"]
        print(f"{r['system']:<26} {r['tokens_per_second']:>9.1f} {r['tflops']:>8.2f} "
              f"{gib(r['peak_gpu_bytes']):>8} {gib(r['peak_rss_bytes']):>8} "
              f"{ph['forward'] * 1e3:>8.1f} {ph['backward'] * 1e3:>8.1f} "
              f"{ph['step'] * 1e3:>8.1f} {r['final_loss']:>8.4f}")


def ratios(rows, judged):
    by = {r["system"]: r for r in rows if "error" not in r}
    out = {}
    for key, ours, peer, target in RATIOS:
        if ours in by and peer in by:
            out[key] = by[ours]["tokens_per_second"] / by[peer]["tokens_per_second"]
            verdict = ("met" if out[key] >= target else "NOT met") if judged else "not judged"
            print(f"{key}: {out[key]:.3f} (target >= {target}: {verdict})")
    return out


def driver(args):
    import torch
    judged = args.device == "cuda"
    where = torch.cuda.get_device_name(0) if judged else "the CPU (script check only)"
    layers = args.layers or SHAPES[args.shape]["num_hidden_layers"]
    print(f"zs bench gpu: Llama shape {args.shape}, {layers} layers, sequence {args.seq}, "
          f"batch {args.batch}, on {where}; torch {torch.__version__}; activations "
          f"recomputed in backward: {checkpointed(args, False)} in the throughput rows, "
          f"{checkpointed(args, True)} in the search")
    if ROWS[2] in args.rows.split(","):  # DeepSpeed's CPU Adam: compiled here, not in the row
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import deepspeed_ops
        print(deepspeed_ops.prepare(cpu=not judged)[0], flush=True)
    rows = [] if args.search_only else [
        run_row(args, row, layers, args.steps, args.warmup, args.timeout)
        for row in args.rows.split(",")]
    print_rows(rows)
    for r in rows:
        if r.get("planned_device_bytes") and r.get("peak_gpu_bytes"):
            print(f"{r['system']}: Planner's device bytes {r['planned_device_bytes'] / 2**30:.2f} "
                  f"GiB (activations {r['planned_activation_bytes'] / 2**30:.2f}), ledger peak {r['ledger_device_peak'] / 2**30:.2f} GiB, torch's peak "
                  f"allocated {r['peak_gpu_bytes'] / 2**30:.2f} GiB: planned/allocated "
                  f"{r['planned_device_bytes'] / r['peak_gpu_bytes']:.3f} (target within 10%)")
    result = {"device": where, "rows": rows, **ratios(rows, judged)}
    if args.search:
        found = [largest(args, row) for row in args.rows.split(",")]
        for f in found:
            print(f"largest {f['system']}: {f['layers']} layers, {f['parameters'] / 1e9:.2f} B "
                  "parameters")
        result["largest"] = found
        peers = max((f["parameters"] for f in found[1:]), default=0)
        if found and found[0]["system"] == ROWS[0] and peers > 0:
            result["zs_largest_vs_peers"] = found[0]["parameters"] / peers
            verdict = ("met" if result["zs_largest_vs_peers"] >= LARGEST_TARGET else "NOT met") \
                if judged else "not judged"
            print(f"zs_largest_vs_peers: {result['zs_largest_vs_peers']:.3f} "
                  f"(target >= {LARGEST_TARGET}: {verdict})")
    if args.json:
        print(json.dumps(result, indent=2))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    p.add_argument("--layers", type=int, default=0, help="default: the shape's")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--search", action="store_true")
    p.add_argument("--search-only", action="store_true",
                   help="the search without the throughput rows")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--timeout", type=int, default=600, help="seconds per row")
    p.add_argument("--search-timeout", type=int, default=300, help="seconds per try")
    p.add_argument("--checkpointing", choices=["search", "on", "off"], default="search",
                   help="recompute each layer's activations in backward, every row alike "
                        "(gradient_checkpointing_enable): in the search's tries only (default), "
                        "everywhere, or nowhere")
    p.add_argument("--deepspeed-ratio", choices=["1", "planned"], default="1",
                   help="DeepSpeed's offload_optimizer.ratio: 1 (its default) or the ratio "
                        "zeroshard's plan gives for the same model and batch")
    p.add_argument("--ratio", default="1", help=argparse.SUPPRESS)
    p.add_argument("--fast-init", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.search = args.search or args.search_only
    for row in args.rows.split(","):
        if row not in ROWS:
            p.error(f"--rows: '{row}' is not a row; allowed: {', '.join(ROWS)}")
    if args.device == "cuda" and not args.worker:
        import torch
        if not torch.cuda.is_available():
            p.error("no CUDA device visible; run on a GPU machine, or --device cpu --shape tiny "
                    "to check the script")
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
