"""Sharded checkpoints from Python on real ranks: exact resume, resharding to another
world size and stage, crash safety, and bad checkpoints refused before anything changes."""
import json
import os
import shutil

import pytest
import torch

from conftest import HERE, run_ranks
from test_equivalence import with_reference_optimizer

WORKER = os.path.join(HERE, "train_worker.py")
STEPS = 12


def train(scratch, tag, config, world, env):
    out = str(scratch / tag)
    run_ranks([WORKER, "zs", "gpt", str(STEPS), out, json.dumps(config)], world, out,
              extra_env=dict(env, ZS_DUMP_PARAMS="1"))
    return [torch.load(f"{out}.rank{r}.pt") for r in range(world)]


def assert_params(got, want, exact):
    for name, w in want.items():
        if exact:
            assert torch.equal(got[name], w), f"{name} differs after resume"
        else:
            diff = (got[name] - w).abs().max().item()
            assert diff <= 1e-5 * max(w.abs().max().item(), 1e-6), f"{name}: {diff}"


def config_for(stage, offload, scratch):
    zero = {"stage": stage}
    if offload in ("cpu", "nvme"):
        zero["offload_optimizer"] = {"device": offload}
    if offload == "nvme" and stage == 3:
        zero["offload_param"] = {"device": "nvme"}
    os.makedirs(scratch / "nvme", exist_ok=True)
    return with_reference_optimizer({"zero_optimization": zero}, scratch / "nvme")


@pytest.mark.parametrize("stage,offload", [(0, "none"), (1, "none"), (2, "none"), (3, "none"),
                                           (2, "cpu"), (3, "nvme")])
def test_resume_is_bit_identical(stage, offload, scratch):
    config = config_for(stage, offload, scratch)
    whole = train(scratch, "whole", config, 2, {})
    ckpt = str(scratch / "ckpt")
    train(scratch, "first", config, 2, {"ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "6",
                                        "ZS_CKPT_STOP": "1"})
    assert open(os.path.join(ckpt, "latest")).read().strip() == "global_step6"
    resumed = train(scratch, "resumed", config, 2, {"ZS_CKPT_LOAD": ckpt})
    for r in range(2):
        assert_params(resumed[r], whole[r], exact=True)


@pytest.mark.parametrize("world,stage", [(2, 2), (1, 3)])
def test_saved_at_four_ranks_stage3_continues_at_another_world_size_and_stage(world, stage,
                                                                             scratch):
    """6 steps at 4 ranks (stage 3), saved; loaded at `world` ranks and `stage`, 6 more:
    the parameters equal 12 uninterrupted steps at 4 ranks (the same global batches)."""
    ckpt = str(scratch / "ckpt")
    four = config_for(3, "none", scratch)
    whole = train(scratch, "whole", four, 4, {})
    train(scratch, "first", four, 4, {"ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "6",
                                      "ZS_CKPT_STOP": "1"})
    resumed = train(scratch, "resumed", config_for(stage, "none", scratch), world,
                    {"ZS_CKPT_LOAD": ckpt})
    assert_params(resumed[0], whole[0], exact=False)
