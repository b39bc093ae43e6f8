"""One rank of a sharded-construction test (zeroshard.init); writes OUT.rankN.json.
usage: construction_worker.py MODE MODEL OUT
MODE:
  plain    the model built as usual, then initialize at stage 3: its initial parameters
           (whole, from the engine) and the losses of 5 steps
  sharded  the same, the model built under zeroshard.init
  meta     built under torch.device("meta"), made by initialize (reset_parameters)
  pretrained  from_pretrained(ZS_PRETRAINED) under zeroshard.init (MODEL: its name)
  peak     a large GPT (0.4 GB) built under zeroshard.init (MODEL sharded) or with it
           disabled (MODEL plain), then initialize: peak RSS (the kernel's high-water
           mark, reset before each) of the construction and of initialize
MODEL: gpt (examples/train_gpt.py's), llama or gpt2 (transformers, small configs)."""
import importlib.util
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
spec = importlib.util.spec_from_file_location("train_gpt", os.path.join(ROOT, "examples",
                                                                         "train_gpt.py"))
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)
import zeroshard  # noqa: E402

CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
          "zero_optimization": {"stage": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
VOCAB, SEQ = 96, 16


def build(name, big=False):
    torch.manual_seed(1234)
    if name == "gpt":
        return demo.Gpt(VOCAB, 1024, 8, 8, SEQ) if big else demo.Gpt(VOCAB, 32, 2, 4, SEQ)
    sys.path.insert(0, HERE)
    import hf_worker
    return hf_worker.make(name)


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(VOCAB, (2, SEQ + 1), generator=g)


def loss_of(engine, name, tokens):
    if name == "gpt":
        return engine(tokens[:, :-1], tokens[:, 1:])
    return engine(input_ids=tokens, labels=tokens).loss


def rss_status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the kernel's VmHWM starts again from the current RSS


def peak_run(enabled):
    reset_peak()
    before = rss_status("VmRSS")
    with zeroshard.init(config=CONFIG, enabled=enabled):
        model = build("gpt", big=True)
    built = rss_status("VmHWM") - before
    model_bytes = sum(p.numel() * p.element_size() for p in set(model.parameters()))
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    reset_peak()
    before_init = rss_status("VmRSS")
    engine, _, _, _ = zeroshard.initialize(model=model, config=CONFIG)
    initialized = rss_status("VmHWM") - before_init
    report = engine.memory_report()
    counted = sum(t["peak"] for t in report.values())
    return {"construction_peak": built, "initialize_peak": initialized,
            "model_bytes": model_bytes, "block_bytes": block_bytes,
            "ledger_peak": counted}


def main():
    mode, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    if mode == "peak":
        result = peak_run(enabled=(name != "plain"))
    else:
        if mode == "sharded":
            with zeroshard.init(config=CONFIG):
                model = build(name)
            sharded = sum(p.numel() for p in model.parameters()
                          if zeroshard._engine.construction.is_sharded(p))
        elif mode == "pretrained":
            import transformers
            with zeroshard.init(config=CONFIG):
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    os.environ["ZS_PRETRAINED"], attn_implementation="eager")
            sharded = sum(p.numel() for p in model.parameters()
                          if zeroshard._engine.construction.is_sharded(p))
        elif mode == "meta":
            with torch.device("meta"):
                model = build(name)
            sharded = 0
        else:
            model = build(name)
            sharded = 0
        engine, _, _, _ = zeroshard.initialize(model=model, config=CONFIG)
        initial = {n: t.tolist() for n, t in engine.full_parameters().items()}
        losses = []
        for step in range(5):
            loss = loss_of(engine, name, batch(step, rank))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        result = {"initial": initial, "losses": losses, "sharded_numel": sharded,
                  "numel": sum(p.numel() for p in set(model.parameters()))}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
