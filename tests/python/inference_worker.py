"""One rank of zeroshard.init_inference over hf_worker's Llama: its weights from the module
itself or from a folder save_pretrained wrote (FOLDER), at rest on the device, in host RAM
or on NVMe (TIER), in float32 or bfloat16 (DTYPE). Greedy generation of this rank's own
prompts and one forward's logits, against the plain model on the same weights (a copy
made before the engine, or from_pretrained of the folder). Writes OUT.rankN.json.
With measure_rss, one plain process serves FOLDER from NVMe and reports its RSS growth and
ledger (serve_measured).
usage: inference_worker.py OUT JSON  (JSON: dtype, tier, folder, nvme_path, measure_rss, and
config: a config file instead of the one TIER makes)"""
import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import devices  # noqa: E402
import hf_worker  # noqa: E402

NEW_TOKENS = 8


def quantized_reference(model, quant):
    """The weights DeepSpeed's weight_quantization serves: each nn.Linear and nn.Embedding
    weight (nothing else) quantized and dequantized on its own, in groups of group_size along
    dimension 1, in the weight's dtype, by DeepSpeed's own Quantizer and DeQuantizer
    (asymmetric: DeepSpeed has no other), or symmetric by the same steps around 0 (codes
    -q..q, scale q / max|x|)."""
    bits, size, symmetric = quant["num_bits"], quant["group_size"], quant["symmetric"]
    weights = {id(m.weight): m.weight for m in model.modules()
               if type(m) in (torch.nn.Linear, torch.nn.Embedding)}
    with torch.no_grad():
        for w in weights.values():
            if not symmetric:
                os.environ.setdefault("DS_ACCELERATOR", "cpu")
                from deepspeed.inference.quantization.utils import DeQuantizer, Quantizer
                config = {"num_bits": bits, "group_size": size, "group_dim": 1,
                          "symmetric": False}
                codes, scale, low = Quantizer(config).quantize(w.data)
                w.copy_(DeQuantizer(config, w.dtype).dequantize(codes, scale, low))
                continue
            q = 2 ** (bits - 1) - 1
            x = w.detach().reshape(-1, size)
            scale = x.abs().amax(1, keepdim=True).reciprocal() * q
            codes = (x * scale).clamp(-q, q).round().nan_to_num(0)
            w.copy_((codes / scale).reshape(w.shape))
    return model


def config_of(spec):
    zero = {"stage": 3}
    if spec["tier"] != "device":
        zero["offload_param"] = {"device": spec["tier"]}
        if spec["tier"] == "nvme":
            # max_in_cpu 0: none of the weights kept in host RAM beside NVMe (DeepSpeed's key)
            zero["offload_param"].update(nvme_path=spec["nvme_path"], max_in_cpu=0)
    config = {"zero_optimization": zero}
    if spec.get("quant"):  # DeepSpeed's key for ZeRO-Inference's int8/int4 weights
        config["weight_quantization"] = {"quantized_initialization": spec["quant"]}
    return config


def status():
    """This process's resident and peak resident bytes."""
    with open("/proc/self/status") as f:
        return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f
                if line.startswith(("VmRSS", "VmHWM"))}


def serve_measured(spec):
    """The folder's model served from NVMe, the process's RSS measured around it: the
    baseline after a tiny model of the same class has generated (imports and code paths
    loaded), the peak reset there (clear_refs 5)."""
    import transformers
    import zeroshard
    tiny = transformers.AutoConfig.from_pretrained(spec["folder"])
    tiny.update(dict(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2))
    warm = transformers.AutoModelForCausalLM.from_config(tiny)
    warm.generate(torch.ones(1, 2, dtype=torch.long), max_new_tokens=2, do_sample=False,
                  pad_token_id=0)
    del warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status()["VmRSS"]
    engine = zeroshard.init_inference(spec["folder"], config=config_of(spec))
    prompts = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    kwargs = dict(attention_mask=torch.ones_like(prompts), max_new_tokens=NEW_TOKENS,
                  do_sample=False, pad_token_id=0)
    got = engine.generate(prompts, **kwargs)
    grown = status()["VmHWM"] - base
    report = engine.memory_report()
    ledger = {f"{tier}.{kind}": v for tier in ("device", "host", "nvme")
              for kind, v in report[tier]["kinds"].items()}
    del engine
    plain = transformers.AutoModelForCausalLM.from_pretrained(spec["folder"]).eval()
    with torch.no_grad():
        want = plain.generate(prompts, **kwargs)
    return {"rss_grown": grown, "ledger": ledger, "tokens_equal": torch.equal(got, want),
            "prompt": list(prompts.shape)}


def main():
    out, spec = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)
    if spec.get("measure_rss"):
        with open(f"{out}.rank0.json", "w") as f:
            json.dump(serve_measured(spec), f)
        return
    import transformers
    import zeroshard
    rank = int(os.environ.get("RANK", "0"))
    dtype = getattr(torch, spec["dtype"])
    g = torch.Generator().manual_seed(100 + rank)  # every rank its own prompts
    dev = devices.device()  # (a folder's model goes to cuda:LOCAL_RANK: one rank a GPU)
    prompts = torch.randint(3, hf_worker.VOCAB, (2, 6), generator=g).to(dev)
    if spec.get("folder"):
        plain = transformers.AutoModelForCausalLM.from_pretrained(spec["folder"],
                                                                  dtype=dtype).to(dev)
        served = spec["folder"]
        engine = zeroshard.init_inference(served, config=spec.get("config") or config_of(spec),
                                          dtype=dtype)
    else:
        model = hf_worker.make("llama").to(dev, dtype)
        plain = copy.deepcopy(model)
        engine = zeroshard.init_inference(model, config=config_of(spec))
    plain.eval()
    exact = None
    if spec.get("quant"):  # the engine's weights: the plain ones quantized another way
        exact = copy.deepcopy(plain)
        quantized_reference(plain, spec["quant"])
    kwargs = dict(attention_mask=torch.ones_like(prompts), max_new_tokens=NEW_TOKENS,
                  do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = plain.generate(prompts, **kwargs)
        want_logits = plain(input_ids=prompts).logits.float()
    got = engine.generate(prompts, **kwargs)
    logits = engine(input_ids=prompts).logits.float()
    report = engine.memory_report()
    result = {"tokens_equal": torch.equal(got, want), "new_tokens": got.shape[1] - prompts.shape[1],
              "logits_diff": (logits - want_logits).abs().max().item(),
              "rest": {tier: report[tier]["kinds"]["params"]["current"]
                       for tier in ("device", "host", "nvme")},
              "trainable": sum(p.requires_grad for p in engine.module.parameters()),
              "ledger": {f"{tier}.{kind}": v for tier in ("device", "host", "nvme")
                         for kind, v in report[tier]["kinds"].items()},
              # construction's peak of kept shards where the gathers are
              "device_params_peak": report["device"]["kinds"]["params"]["peak"],
              "optimizer_bytes": sum(report[t]["kinds"][k]["peak"] for t in report
                                     for k in ("optimizer_states", "master_params", "grads",
                                               "grads_fp32"))}
    if exact is not None:  # the error quantization itself makes, against the exact weights
        with torch.no_grad():
            exact_logits = exact(input_ids=prompts).logits.float()
        result["error_vs_exact"] = ((logits - exact_logits).abs().max() /
                                    exact_logits.abs().max()).item()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
