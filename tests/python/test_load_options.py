"""DeepSpeed's save_checkpoint and load_checkpoint keywords on 2 real ranks
(load_options_worker.py: the GPT of models.py with block 0's LayerNorm frozen, AdamW from
the config, a client LambdaLR):
- exclude_frozen_parameters leaves the frozen parameters out; loading that checkpoint
  strictly is refused naming one, and with load_module_strict=False it resumes
  bit-identically to the uninterrupted run; save_latest=False leaves `latest` alone;
- load_optimizer_states=False and load_module_only=True train as torch's AdamW does under
  DDP when started fresh from the checkpoint's weights, the scheduler's state loaded in
  the first case and not in the second; the step counts say so;
- a config scheduler's position comes with the step count unless
  load_lr_scheduler_states=False;
- what cannot be honoured is refused by name; a folder without `latest` loads nothing and
  says so, as DeepSpeed does."""
import json
import os

import pytest
import torch

from conftest import HERE, both_legs, checkpoint_config, run_ranks

WORKER = os.path.join(HERE, "load_options_worker.py")
FROZEN = "blocks.0.ln.weight"


def assert_trains_like(ranks, out, name, scheduled):
    """Each rank's losses and the parameters are DDP's with torch's AdamW from the step-6
    weights; returns rank 0's losses."""
    want_losses = run_ranks([WORKER, "ddp", out, str(scheduled)], 2, f"{out}.ddp")
    want = torch.load(f"{out}.ddp.pt")
    for rank, r in enumerate(ranks):
        for step, (a, b) in enumerate(zip(r[name], want_losses[rank])):
            assert abs(a - b) <= 1e-6 * b, f"{name} rank {rank} step {step}: {a} vs {b}"
    got = torch.load(f"{out}.{name}.pt")
    for key, w in want.items():
        diff = (got[key] - w).abs().max().item()
        assert diff <= 1e-5 * w.abs().max().item(), f"{name}: {key} off by {diff}"
    return want_losses[0]


@pytest.mark.parametrize("stage,offload", [(2, "cpu"), both_legs(3, "nvme")])
def test_deepspeeds_checkpoint_keywords(stage, offload, scratch):
    config = checkpoint_config(stage, offload, scratch)
    ckpt, out = str(scratch / "ckpt"), str(scratch / "run")
    ranks = run_ranks([WORKER, "zs", json.dumps(config), ckpt, out], 2, out, timeout=600)
    seen = ranks[0]

    # exclude_frozen_parameters, save_latest, load_module_strict
    assert seen["tag"] == "global_step6" and seen["latest"] == "global_step6"
    with open(os.path.join(ckpt, "global_step6", "manifest.json")) as f:
        saved = {p["name"] for g in json.load(f)["groups"] for p in g["params"]}
    with open(os.path.join(ckpt, "whole", "manifest.json")) as f:
        whole = {p["name"] for g in json.load(f)["groups"] for p in g["params"]}
    assert whole - saved == {FROZEN, "blocks.0.ln.bias"}
    assert f"has no parameter '{FROZEN}'" in seen["strict_error"]
    assert "load_module_strict=False" in seen["strict_error"]
    assert seen["resumed_path"] == os.path.join(ckpt, "global_step6")
    assert seen["resumed_steps"] == 6
    for r in ranks:
        assert r["resumed"] == r["uninterrupted"]
    resumed, uninterrupted = (torch.load(f"{out}.{n}.pt") for n in ("resumed", "uninterrupted"))
    for key, w in uninterrupted.items():
        assert torch.equal(resumed[key], w), f"{key} differs after the non-strict resume"

    # load_optimizer_states=False: the scheduler's state and step count come, Adam's do not
    assert seen["weights_only_at"] == [6, 6] and seen["weights_only_after"] == 12
    continued = assert_trains_like(ranks, out, "weights_only", 6)
    # load_module_only=True: the weights alone
    assert seen["module_only_at"] == [0, 0] and seen["module_only_after"] == 6
    restarted = assert_trains_like(ranks, out, "module_only", 0)
    assert abs(continued[-1] - restarted[-1]) > 0.1  # the schedule's position mattered

    # A trainable parameter the checkpoint lacks: its values stay, its state cannot come
    assert "pass load_optimizer_states=False" in seen["trainable_missing_error"]
    kept, w6 = torch.load(f"{out}.kept.pt"), torch.load(f"{out}.w6.pt")
    assert torch.equal(kept[FROZEN], w6[FROZEN])  # the model's own, never trained
    assert torch.equal(kept["blocks.0.fc1.weight"], w6["blocks.0.fc1.weight"])

    # A config scheduler's position (WarmupLR, linear to 1e-2 over 10 steps; the step after
    # 6 advances uses iteration 5, as DeepSpeed's does). Without the optimizer's state the
    # groups keep their lr for one step, as DeepSpeed's do (test_deepspeed_script compares).
    lrs = seen["config_schedule"]
    assert lrs["fresh"] == [0.0, 0]
    assert lrs["full"] == [pytest.approx(5e-3), 6]
    assert lrs["weights_only"] == [0.0, 6]
    assert lrs["kept_position"] == [0.0, 6]

    assert seen["no_latest"] == [None, None]
    assert "custom_load_fn=...): not supported" in seen["custom_load_fn"]
    assert "scale_wrt_gas=False): not supported" in seen["scale_wrt_gas"]
