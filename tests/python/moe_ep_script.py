"""A transformers mixture-of-experts model (Mixtral with 4 experts or Qwen3-MoE with 8, top
2, from a config; at stage 3 each MoE block a unit) trained on 4 ranks with its experts
split over 2 expert-parallel ranks by the config's expert_parallel section (DeepSpeed's
AutoEP keys), each rank its own sample per
step; beside it the same model trained in one process on every rank's samples as one batch
(torch's AdamW). Each rank writes to OUT.rankN.json its losses and the reference's, the
engine's gradient norms and the reference's, the largest difference of its parameters
(its own experts' slices) from the reference's after the last step, and the optimizer
state its ledger holds and its plan predicted beside the elements of its dense and expert
parameters; the largest difference of the engine's state_dict (every rank's experts
joined) and of the model save_pretrained wrote, loaded by from_pretrained, from the
reference's parameters; the bytes its first step put into the experts' all-to-alls. Then it
saves a checkpoint (OUT.ckpt; rank 0 the whole state_dict
beside it, OUT.whole.pt) and trains 3 steps more. With --resume CKPT EP it instead loads CKPT
into the model split over EP ranks and trains those 3 steps: their losses and norms and the
reference's.

With --zero_init the model is built inside zeroshard.init; with --skewed its routers send
every token to the first expert-parallel rank's experts (the others get none); with
--no_grouped_mm the section says use_grouped_mm false (the reference keeps transformers'
default grouped_mm). Each rank also writes how many grouped GEMMs (aten._grouped_mm) its
first step ran.

usage: moe_ep_script.py OUT MODEL STAGE [--resume CKPT EP] [--zero_init] [--skewed]
                        [--no_grouped_mm]"""
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import zeroshard
import devices
from counted_collectives import Counted
from moe_models import SHAPE, make
from rank_result import leave

STEPS, SEQ, WORLD, EP, LR = 3, 12, 4, 2, 1e-3
ZERO_INIT = "--zero_init" in sys.argv
SKEWED = "--skewed" in sys.argv
GROUPED_MM = "--no_grouped_mm" not in sys.argv


def make_model(kind):
    model = make(kind)
    if SKEWED:  # every route to the experts of the first expert-parallel rank
        for layer in model.model.layers:
            layer.mlp.gate.register_forward_hook(
                lambda module, args, out: (out[0], out[1], out[2] % (module.num_experts // EP)))
    return model


class GroupedGemms(TorchDispatchMode):
    """Counts the grouped GEMMs run inside it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.ops.aten._grouped_mm.default
        return func(*args, **(kwargs or {}))


def grad_norm(params):
    return torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params
                          if p.grad is not None)).item()


def reference(kind, ids):
    """Losses and norms of 2 x STEPS steps, and the parameters after the first STEPS."""
    model = make_model(kind).to(devices.device())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(2 * STEPS):
        if step == STEPS:
            params = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        each = [model(input_ids=ids[i][None], labels=ids[i][None]).loss
                for i in range(step * WORLD, (step + 1) * WORLD)]
        (sum(each) / WORLD).backward()
        norms.append(grad_norm(model.parameters()))
        opt.step()
        losses.append([loss.item() for loss in each])
    return losses, norms, params


def train(engine, ids, steps, counted=None):
    """The engine's losses and pre-clip norms over `steps`, each rank its own sample;
    `counted` gets the bytes of the first step's all-to-alls and its grouped GEMMs."""
    losses, norms = [], []
    for step in steps:
        if counted is not None and step == steps[0]:
            with Counted("all_to_all_single") as exchanges, GroupedGemms() as gemms:
                (loss,), (norm,) = train(engine, ids, [step])
            losses.append(loss)
            norms.append(norm)
            counted += [exchanges.bytes, gemms.calls]
            continue
        sample = ids[step * WORLD + engine.global_rank][None]
        loss = engine(input_ids=sample, labels=sample).loss
        engine.backward(loss)
        engine.step()
        norms.append(float(engine.get_global_grad_norm()))  # the step's, before clipping
        losses.append(loss.item())
    return losses, norms


def initialize(kind, stage, ep):
    if ZERO_INIT:  # each rank keeps its shards while the model is built
        with zeroshard.init(config={"zero_optimization": {"stage": 3}}):
            model = make_model(kind)
    else:
        model = make_model(kind).to(devices.device())
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
              "expert_parallel": {"enabled": True, "autoep_size": ep,
                                  "use_grouped_mm": GROUPED_MM}}
    # Stage 3: each MoE block a unit of its own, its router (dense) beside its experts (a
    # group of their own), so the unit waits for both groups' gradients.
    units = [layer.mlp for layer in model.model.layers] if stage == 3 else None
    engine, *_ = zeroshard.initialize(model=model, config=config, units=units)
    return model, engine


def resume(out, kind, stage, ids, ckpt, ep):
    _, engine = initialize(kind, stage, ep)
    engine.load_checkpoint(ckpt)
    losses, norms = train(engine, ids, range(STEPS, 2 * STEPS))
    want_losses, want_norms, _ = reference(kind, ids)
    leave(out, {"losses": losses, "norms": norms, "want_norms": want_norms[STEPS:],
                "want_losses": [each[engine.global_rank] for each in want_losses[STEPS:]]})


def largest_difference(got, want):
    """The largest elementwise difference, or the names `got` lacks."""
    missing = sorted(set(want) - set(got))
    return missing or max((got[n].float().cpu() - want[n].detach().cpu()).abs().max().item()
                          for n in want)


def main():
    out, kind, stage = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(5)
    ids = torch.randint(0, SHAPE["vocab_size"], (2 * STEPS * WORLD, SEQ)).to(devices.device())
    if sys.argv[4:5] == ["--resume"]:
        return resume(out, kind, stage, ids, sys.argv[5], int(sys.argv[6]))
    model, engine = initialize(kind, stage, EP)
    rank = engine.global_rank
    exchanged = []
    losses, norms = train(engine, ids, range(STEPS), exchanged)
    if rank == 0:  # for zeroshard-estimate --hf-config
        model.config.to_json_file(f"{out}.config.json")
    whole = engine.state_dict()  # every rank's experts joined: the one-process model's
    engine.save_pretrained(f"{out}.hf")
    engine.save_checkpoint(f"{out}.ckpt")
    if rank == 0:
        torch.save(devices.on_host(whole), f"{out}.whole.pt")
    want_losses, want_norms, want = reference(kind, ids)
    loaded = type(model).from_pretrained(f"{out}.hf").state_dict()
    whole_diff = {"state_dict": largest_difference(whole, want),
                  "from_pretrained": largest_difference(loaded, want)}
    local = (rank % EP) * (model.config.num_experts if kind == "qwen3_moe" else 4) // EP
    worst, experts, dense = 0.0, 0, 0
    for name, p in model.named_parameters():
        expected = want[name].detach()
        if getattr(p, "allreduce", True) is False:  # this rank's experts
            expected = expected[local:local + p.shape[0]]
            experts += p.numel()
        else:
            dense += p.numel()
        worst = max(worst, (p.detach() - expected).abs().max().item())
    report = engine.memory_report()
    held, planned = (sum(tier["kinds"].get("optimizer_states", {}).get(what, 0)
                         for tier in report.values()) for what in ("current", "predicted"))
    went_on, _ = train(engine, ids, range(STEPS, 2 * STEPS))  # what a resumed run repeats
    leave(out, {"losses": losses, "want_losses": [each[rank] for each in want_losses[:STEPS]],
                "norms": norms, "want_norms": want_norms[:STEPS], "param_diff": worst,
                "went_on": went_on, "exchanged_bytes": exchanged[0],
                "grouped_gemms": exchanged[1],
                "optimizer_state_bytes": held, "optimizer_state_planned": planned,
                "dense_numel": dense, "expert_numel": experts, "whole_diff": whole_diff,
                "whole_keys": sorted(whole) == sorted(want)})


if __name__ == "__main__":
    main()
