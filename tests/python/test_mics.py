"""Sharding inside groups (zero_optimization.mics_shard_size, DeepSpeed's MiCS) on 4 real
ranks of this machine, in groups of 2: training equals torch DDP on 4 ranks, and a
checkpoint saved with groups holds one file per shard and continues at 2 ranks without
groups, and at 4 with them, as 12 uninterrupted steps did. Across separate hosts:
tests/python/test_hosts.py."""
import json
import os

import pytest

from conftest import (EQUIVALENCE_STEPS as STEPS, HERE, assert_params, assert_same, both_legs,
                      run_ranks, train_params as train, with_reference_optimizer)

WORKER = os.path.join(HERE, "train_worker.py")
WORLD, GROUP = 4, 2
_reference = {}


def grouped(stage, scratch, mics=GROUP):
    zero = {"stage": stage, "mics_shard_size": mics}
    return with_reference_optimizer({"zero_optimization": zero}, scratch)


@pytest.mark.parametrize("stage", [1, both_legs(3)])
def test_groups_of_two_on_four_ranks_equal_ddp(stage, scratch):
    if "ddp" not in _reference:
        out = str(scratch / "ddp")
        _reference["ddp"] = run_ranks([WORKER, "ddp", "gpt", str(STEPS), out], WORLD, out)
    out = str(scratch / f"zs{stage}")
    got = run_ranks([WORKER, "zs", "gpt", str(STEPS), out, json.dumps(grouped(stage, scratch))],
                    WORLD, out)
    assert_same(got, _reference["ddp"])


def test_checkpoint_with_groups_continues_without_them_and_with_them(scratch):
    ckpt = str(scratch / "ckpt")
    config = grouped(3, scratch)
    whole = train(scratch, "whole", config, WORLD, {})
    train(scratch, "first", config, WORLD, {"ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "6",
                                            "ZS_CKPT_STOP": "1"})
    folder = os.path.join(ckpt, "global_step6")
    assert sorted(f for f in os.listdir(folder) if f.endswith(".bin")) == ["rank0.bin",
                                                                          "rank1.bin"]
    assert json.load(open(os.path.join(folder, "manifest.json")))["world_size"] == GROUP
    again = train(scratch, "again", config, WORLD, {"ZS_CKPT_LOAD": ckpt})
    for r in range(WORLD):
        assert_params(again[r], whole[r], exact=False)
    # The global batch is the same at any world size (models.batch).
    flat = train(scratch, "flat", grouped(2, scratch, mics=-1), 2, {"ZS_CKPT_LOAD": ckpt})
    assert_params(flat[0], whole[0], exact=False)
