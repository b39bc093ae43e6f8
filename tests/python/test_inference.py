"""zeroshard.init_inference: a Llama served by the engine at stage 3 with its weights frozen,
at rest on the device, in host RAM or on NVMe, from the module or from a folder
save_pretrained wrote in shards (read tensor by tensor into the engine), as one plain
process (no launcher's environment) or 2 ranks each generating its own prompts. Greedy
tokens and one forward's logits equal the plain model's on the same weights bit for bit;
the ledger holds the weights in the tier asked for and no optimizer state or gradient, and
construction never held more than one unit's weights where the gathers are."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, HERE, main_leg_only, run_ranks, run_snippet

WORKER = os.path.join(HERE, "inference_worker.py")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
PARAMS = 24768  # hf_worker's Llama


def serve(spec, scratch, world):
    out = str(scratch / f"serve{len(list(scratch.iterdir()))}")
    if world > 1:
        return run_ranks([WORKER, out, json.dumps(spec)], world, out, timeout=300)
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), OMP_NUM_THREADS="1")
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(v, None)  # a plain `python script.py`
    r = subprocess.run([sys.executable, WORKER, out, json.dumps(spec)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(f"{out}.rank0.json") as f:
        return [json.load(f)]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
@pytest.mark.parametrize("dtype,tier,source,world", [
    ("float32", "device", "module", 1),
    ("float32", "cpu", "module", 2),
    ("bfloat16", "nvme", "module", 1),
    ("bfloat16", "nvme", "folder", 1),
    ("bfloat16", "cpu", "folder", 2),
    ("float32", "nvme", "module", 2),
])
def test_served_weights_generate_the_plain_models_tokens(dtype, tier, source, world, scratch):
    spec = {"dtype": dtype, "tier": tier, "nvme_path": str(scratch / "nvme")}
    os.makedirs(spec["nvme_path"])
    if source == "folder":
        import torch
        sys.path.insert(0, HERE)
        import hf_worker
        folder = scratch / "saved"
        hf_worker.make("llama").to(getattr(torch, dtype)).save_pretrained(folder,
                                                                          max_shard_size="40KB")
        assert len([f for f in os.listdir(folder) if f.endswith(".safetensors")]) > 1
        spec["folder"] = str(folder)
    ranks = serve(spec, scratch, world)
    element = 4 if dtype == "float32" else 2
    for r in ranks:
        assert r["tokens_equal"] and r["new_tokens"] == 8, r
        assert r["logits_diff"] == 0.0, r
        assert r["trainable"] == 0 and r["optimizer_bytes"] == 0, r
        held = {"device": "device", "cpu": "host", "nvme": "nvme"}[tier]
        assert r["rest"][held] >= PARAMS * element // world, r  # its shard, padded
        assert all(v == 0 for t, v in r["rest"].items() if t != held), r
        if tier != "device":  # each unit's shard left for its tier as it was built
            assert r["device_params_peak"] <= PARAMS * element // world // 2, r


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
def test_a_model_four_times_the_device_budget_generates_from_nvme_within_the_plan(scratch):
    """A 24-block Llama (20.0M fp32 parameters, 76 MiB) from a folder, weights on NVMe:
    the plan gives the device (host RAM on this machine) three units and one unit's shard
    (12 MiB), the weights are more than 4x that; every ledger kind stays within its
    prediction, and the process's RSS grows by no more than the plan's device and host
    bytes, the KV cache, the two mappings the page allocator keeps (sharding/
    PageAllocator.h) and 8 MiB for what the plan does not count (the meta model's objects,
    one block's temporaries, the logits)."""
    import transformers
    folder = scratch / "llama24"
    config = transformers.LlamaConfig(vocab_size=2000, hidden_size=256, intermediate_size=688,
                                      num_hidden_layers=24, num_attention_heads=4,
                                      num_key_value_heads=4, tie_word_embeddings=False)
    import torch
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="20MB")
    spec = {"dtype": "float32", "tier": "nvme", "nvme_path": str(scratch / "nvme"),
            "folder": str(folder), "measure_rss": True}
    os.makedirs(spec["nvme_path"])
    r = serve(spec, scratch, 1)[0]
    assert r["tokens_equal"], r
    ledger = r["ledger"]
    for name, v in ledger.items():
        assert v["peak"] <= v["predicted"], (name, v)
    weights = ledger["nvme.params"]["current"]
    assert weights >= 20_000_000 * 4, r
    device = sum(v["predicted"] for k, v in ledger.items() if k.startswith("device."))
    host = sum(v["predicted"] for k, v in ledger.items() if k.startswith("host."))
    assert weights >= 4 * device, (weights, device)
    block = 4 * (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256)  # one unit, fp32
    batch, prompt = r["prompt"]
    kv_cache = 24 * 2 * batch * (prompt + 8) * 256 * 4
    allowance = device + host + kv_cache + 2 * block + 8 * 2**20
    print(f"RSS grew {r['rss_grown'] / 2**20:.1f} MiB; plan device {device / 2**20:.1f} + host "
          f"{host / 2**20:.1f} MiB; weights {weights / 2**20:.1f} MiB on NVMe")
    assert r["rss_grown"] <= allowance, (r["rss_grown"], allowance)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
def test_the_estimators_serving_config_serves_and_its_plan_bounds_the_ledger(scratch):
    """zeroshard-estimate --inference on a folder's config.json emits a config that
    init_inference serves the folder with (the plain model's tokens), and what it planned for
    the weights gathered on the device bounds what the engine's ledger held;
    zeroshard.estimate(inference=True) plans the same module the same way."""
    sys.path.insert(0, HERE)
    import hf_worker
    import zeroshard
    folder = scratch / "saved"
    model = hf_worker.make("llama")
    model.save_pretrained(folder)
    emitted = scratch / "serve.yaml"
    cli = subprocess.run(
        [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config",
         str(folder / "config.json"), "--inference", "--fp32", "--seq", "14", "--batch", "2",
         "--emit-config", str(emitted), "--json"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    plan = json.loads(cli.stdout)
    chosen = next(o for o in plan["options"] if o["recommended"])
    assert chosen["offload_param"] == "none", chosen  # 99 KB of weights fit on the device
    assert "\noptimizer:" not in "\n" + emitted.read_text()  # no optimizer section
    spec = {"dtype": "float32", "tier": "device", "folder": str(folder), "config": str(emitted)}
    r = serve(spec, scratch, 1)[0]
    assert r["tokens_equal"] and r["logits_diff"] == 0.0, r
    gathered = r["ledger"]["device.gathered_params"]
    planned = chosen["bytes_by_kind"]["device"]["gathered_params"]
    assert 0 < gathered["peak"] <= planned, (gathered, planned)
    assert planned == gathered["predicted"], (planned, gathered)  # the engine's own plan
    # The Python estimate of the module: the same KV cache and gathered units.
    est = zeroshard.estimate(model, inference=True, seq=14, micro_batch=2)
    small = hf_worker.SMALL  # keys and values: kv heads x head size, 2 sequences of 14, fp32
    kv = small["num_key_value_heads"] * small["hidden_size"] // small["num_attention_heads"]
    assert est["kv_cache_bytes"] == plan["inference"]["kv_cache_bytes"] == \
        2 * small["num_hidden_layers"] * 2 * 14 * kv * 4
    weights = 4 * sum(p.numel() for p in model.parameters())
    stream = est["options"][0]["stream"]  # every weight and the KV cache read on the device
    assert stream["device_bytes_per_step"] == weights + est["kv_cache_bytes"], est
    assert stream["kv_cache"] == "device", est
    # The engine's own count of the cache generate would keep (it decides the offloaded cache
    # on a GPU from it): the estimator's.
    from zeroshard.inference.engine import kv_cache_bytes
    assert kv_cache_bytes(model, batch=2, tokens=14) == est["kv_cache_bytes"]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
@pytest.mark.parametrize("bits,symmetric,dtype,tier,world", [
    (8, False, "float32", "device", 1),
    (4, False, "float32", "nvme", 1),
    (4, False, "bfloat16", "cpu", 2),
    (8, True, "bfloat16", "nvme", 1),
    (8, True, "bfloat16", "cpu", 2),
])
def test_quantized_weights_are_the_plain_ones_quantized_and_a_fraction_of_the_bytes(
        bits, symmetric, dtype, tier, world, scratch):
    """weight_quantization (DeepSpeed's keys): the served weights are the plain model's
    nn.Linear and nn.Embedding weights quantized by DeepSpeed's own Quantizer and
    DeQuantizer (asymmetric; symmetric, which DeepSpeed lacks, by the same steps in the
    test: inference_worker quantized_reference), the norms untouched, so greedy tokens and
    logits equal that model's on any number of ranks; at rest each weight element takes
    bits / 8 bytes and each group of 32 a scale (and a minimum) in the dtype, each norm
    element its own bytes."""
    quant = {"num_bits": bits, "group_size": 32, "symmetric": symmetric}
    spec = {"dtype": dtype, "tier": tier, "nvme_path": str(scratch / "nvme"), "quant": quant}
    os.makedirs(spec["nvme_path"])
    value = 4 if dtype == "float32" else 2
    norms = 5 * 32  # hf_worker.SMALL's hidden size: two norms per block and the final one
    want = (PARAMS - norms) * (bits / 8 + (1 if symmetric else 2) * value / 32) + norms * value
    held = {"device": "device", "cpu": "host", "nvme": "nvme"}[tier]
    results = serve(spec, scratch, world)
    for r in results:
        assert r["tokens_equal"], r
        assert r["logits_diff"] <= 1e-5, r
        assert r["error_vs_exact"] <= (0.05 if bits == 8 else 0.5), r
        # memory_report's prediction counts the codes, not the weights at full size.
        kept = r["ledger"][f"{held}.params"]
        assert kept["current"] <= kept["predicted"] <= 1.1 * kept["current"] + 9 * 4096, kept
    # Every rank's shard; each unit's parts padded to 16 bytes (NVMe regions to 4,096), a
    # group cut between two ranks counted by both.
    rest = sum(r["rest"][held] for r in results)
    slack = (4096 if tier == "nvme" else 64 + 4 * value) * 5 * world
    assert want <= rest <= want + slack, (rest, want)
    print(f"int{bits} {'symmetric' if symmetric else 'asymmetric'} {dtype} on {tier}, {world} "
          f"rank(s): logits error vs the exact weights {results[0]['error_vs_exact']:.4f} of "
          f"the largest; {rest} bytes at rest ({rest / (PARAMS * value):.3f} of the "
          "unquantized)")


HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.mark.skipif(not (HAS_TRANSFORMERS and HAS_DEEPSPEED), reason="no transformers/deepspeed")
@pytest.mark.parametrize("bits,dtype,within", [(8, "float32", 1e-6), (4, "bfloat16", 4e-3)])
def test_quantized_logits_are_deepspeeds_own(bits, dtype, within, scratch):
    """One folder served with the same weight_quantization config by DeepSpeed's own ZeRO-3
    engine (from_pretrained under its zero.Init, quantized as it loads) and by zeroshard:
    the logits agree (fp32 to float rounding, bf16 to a few of its steps) ten times closer
    than either is to the unquantized model's, and the greedy tokens are the same."""
    import torch
    sys.path.insert(0, HERE)
    import hf_worker
    folder = str(scratch / "model")
    hf_worker.make("llama").to(getattr(torch, dtype)).save_pretrained(folder)
    worker = os.path.join(HERE, "quantized_peer_worker.py")
    got = {}
    for peer in ("deepspeed", "zeroshard", "plain"):
        got[peer] = run_ranks([worker, str(scratch / peer), folder, str(bits), dtype, peer], 1,
                              str(scratch / peer), timeout=300,
                              extra_env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})[0]
    logits = {k: torch.tensor(v["logits"]) for k, v in got.items()}
    apart = (logits["deepspeed"] - logits["zeroshard"]).abs().max().item()
    moved = (logits["deepspeed"] - logits["plain"]).abs().max().item()
    print(f"int{bits} {dtype}: zeroshard vs DeepSpeed {apart:.2e}; quantization moved the "
          f"logits {moved:.2e}")
    assert apart <= within and apart * 10 < moved, (apart, moved)
    if dtype == "float32":
        assert got["deepspeed"]["tokens"] == got["zeroshard"]["tokens"]


@main_leg_only
def test_what_inference_has_no_use_for_is_refused_by_name(scratch):
    code, out = run_snippet(
        "zeroshard.init_inference(model, config={'optimizer': {'type': 'AdamW'}})",
        launched=False)
    assert code != 0
    assert ("zeroshard.init_inference: config dict: the 'optimizer' section has no use in "
            "inference; remove it") in out, out
    code, out = run_snippet(
        "zeroshard.init_inference(model, config={'zero_optimization': {'stage': 2, "
        "'offload_param': {'device': 'cpu'}}})", launched=False)
    assert code != 0
    assert ("config key 'zero_optimization.offload_param.device' is 'cpu' with "
            "'zero_optimization.stage' 2; allowed: parameter offload needs stage 3" in out), out
    quant = "'weight_quantization': {'quantized_initialization': {'num_bits': %d}}"
    code, out = run_snippet("zeroshard.init_inference(model, config={%s})" % (quant % 5),
                            launched=False)
    assert code != 0
    assert ("config key 'weight_quantization.quantized_initialization.num_bits' is 5; "
            "allowed: 4 or 8") in out, out
    code, out = run_snippet(  # DeepSpeed's rule: groups along dimension 1, whole
        "zeroshard.init_inference(model, config={'zero_optimization': {'stage': 3}, %s})"
        % (quant % 8), launched=False)
    assert code != 0
    assert ("config key 'weight_quantization.quantized_initialization.group_size' is 64, and "
            "0.weight (shape [4, 4]) has 4 along group_dim 1, not a multiple of it; allowed: a "
            "group_size dividing dimension 1 of every nn.Linear and nn.Embedding weight") in out, out
    quant = quant.replace("}}", ", 'group_size': 4}}")
    code, out = run_snippet(
        "engine = zeroshard.init_inference(model, config={'zero_optimization': {'stage': 3}, "
        "%s})\nengine.engine.save_checkpoint(%r)" % (quant % 8, str(scratch / "ck")),
        launched=False)
    assert code != 0
    assert ("checkpoint save: the weights are kept quantized (weight_quantization."
            "quantized_initialization.num_bits 8), and a checkpoint holds full-precision "
            "shards; allowed: an engine without weight_quantization (or save_16bit_model / "
            "save_pretrained: the weights dequantized)") in out, out
    code, out = run_snippet(f"zeroshard.init_inference({str(scratch)!r})", launched=False)
    assert code != 0
    assert "has neither model.safetensors nor model.safetensors.index.json" in out, out


@pytest.mark.both_legs
def test_a_module_served_in_one_plain_process():
    """No launcher's environment, no transformers: a torch module on the trixie leg too."""
    code, out = run_snippet(
        "model.eval()\n"
        "x = torch.randn(3, 4)\n"
        "want = model(x)\n"
        "engine = zeroshard.init_inference(model, config={'zero_optimization': "
        "{'stage': 3, 'offload_param': {'device': 'cpu'}}})\n"
        "assert torch.equal(engine(x), want)\n"
        "assert not any(p.requires_grad for p in engine.module.parameters())\n"
        "print('served', engine.memory_report()['host']['kinds']['params']['current'])\n",
        launched=False)
    assert code == 0, out
    held = int(out.split("served ")[1].split()[0])
    assert 80 <= held <= 256, out  # a Linear(4, 4): 20 fp32 values, in a padded shard
