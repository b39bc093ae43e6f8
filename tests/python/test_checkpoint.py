"""Sharded checkpoints from Python on real ranks: exact resume, resharding to another
world size and stage, crash safety, and bad checkpoints refused before anything changes."""
import json
import os

import pytest
import torch

from conftest import (BUILD as BUILD_DIR, HERE, assert_params, both_legs,
                      checkpoint_config as config_for, run_ranks, train_params as train)

WORKER = os.path.join(HERE, "train_worker.py")


@pytest.mark.parametrize("stage,offload", [(0, "none"), (1, "none"), (2, "none"), (3, "none"),
                                           both_legs(2, "cpu"), (3, "cpu"), both_legs(3, "nvme")])
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


def with_ratio(config, ratio):
    config = json.loads(json.dumps(config))
    config["zero_optimization"]["offload_optimizer"]["ratio"] = ratio
    return config


def test_an_optimizer_split_between_device_and_host_resumes_into_any_split(scratch):
    """offload_optimizer.ratio 0.5 (the first units' Adam state where the parameters are,
    the rest on the host), saved at step 6 of 12: resumed with the same split, and with
    every shard on the host, it ends at the uninterrupted run's bits (on the CPU both halves
    step with CPU Adam's arithmetic)."""
    split = with_ratio(config_for(3, "cpu", scratch), 0.5)
    whole = train(scratch, "whole", split, 2, {})
    ckpt = str(scratch / "ckpt")
    train(scratch, "first", split, 2, {"ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "6",
                                       "ZS_CKPT_STOP": "1"})
    for name, ratio in (("same", 0.5), ("host", 1.0)):
        resumed = train(scratch, name, with_ratio(split, ratio), 2, {"ZS_CKPT_LOAD": ckpt})
        for r in range(2):
            assert_params(resumed[r], whole[r], exact=True)


@pytest.mark.parametrize("world,stage", [(2, 2), both_legs(1, 3)])
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


@pytest.mark.parametrize("point,rank", [("save.rank_file", 1), both_legs("save.manifest", 0),
                                        ("save.latest", 0)])
def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint_loadable(point, rank, scratch):
    """Save at step 4, then a rank is SIGKILLed at `point` while saving step 8: the others
    stop with an error (no hang), latest still names step 4, and it loads and trains."""
    ckpt = str(scratch / "ckpt")
    config = dict(config_for(3, "none", scratch), comm_timeout_seconds=10)
    out = str(scratch / "crash")
    env = {"ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "4", "ZS_DUMP_PARAMS": "1"}
    run_ranks([WORKER, "zs", "gpt", "8", out, json.dumps(config)], 2, out, extra_env=env)
    env.update(ZS_CKPT_SAVE_AT="8", ZS_TEST_KILL_AT=point, ZS_TEST_KILL_RANK=str(rank))
    results = run_ranks([WORKER, "zs", "gpt", "12", out + "b", json.dumps(config)], 2,
                        out + "b", extra_env=env, expect_ok=False, timeout=120)
    assert results[rank][0] == -9, results[rank][1][-2000:]  # SIGKILL
    survivor_code, survivor_log = results[1 - rank]
    if point == "save.rank_file":  # rank 0 waits for rank 1's file and must give up, not hang
        assert survivor_code != 0, survivor_log[-2000:]
        assert "saving checkpoint 'global_step8' failed" in survivor_log, survivor_log[-2000:]
        assert "rank(s) 1 did not respond" in survivor_log, survivor_log[-2000:]
    assert open(os.path.join(ckpt, "latest")).read().strip() == "global_step4"
    assert not os.path.exists(os.path.join(ckpt, "global_step8", "manifest.json")) or point == "save.latest"
    resumed = train(scratch, "resumed", config, 2, {"ZS_CKPT_LOAD": ckpt})
    whole = train(scratch, "whole", config, 2, {})
    assert_params(resumed[0], whole[0], exact=True)


BAD = """
import os, shutil, torch, zeroshard
def make(width):
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(2))
    m.forward = lambda x: m.blocks[1](m.blocks[0](x)).sum()
    return m
m = make(8)
engine, *_ = zeroshard.initialize(model=m, config={{'zero_optimization': {{'stage': 3}}}})
engine.backward(engine(torch.ones(2, 8))); engine.step()
d = {ckpt!r}
engine.save_checkpoint(d, 'good')
engine.backward(engine(torch.ones(2, 8))); engine.step()
before = engine.state_dict()
f = os.path.join(d, 'good', 'rank0.bin')
case = {case!r}
if case == 'missing':
    os.remove(f)
elif case == 'truncated':
    os.truncate(f, os.path.getsize(f) - 10)
elif case == 'corrupt':
    with open(f, 'r+b') as fh:
        fh.seek(100); b = fh.read(1); fh.seek(100); fh.write(bytes([b[0] ^ 0xFF]))
elif case == 'shape':
    m = make(4)
    engine, *_ = zeroshard.initialize(model=m, config={{'zero_optimization': {{'stage': 3}}}})
    before = engine.state_dict()
try:
    engine.load_checkpoint(d)
    print('LOADED')
except zeroshard.Error as e:
    print('ERROR', e)
after = engine.state_dict()
print('unchanged', all(torch.equal(before[k], after[k]) for k in before))
"""


@pytest.mark.parametrize("case,message", [
    ("missing", "checkpoint file '{f}' is missing"),
    ("truncated", "checkpoint file '{f}' has"),
    ("corrupt", "checkpoint file '{f}' does not match its checksum"),
    ("shape", "parameter 'blocks.0.weight' has shape [8, 8] there and [4, 4] in the model"),
])
def test_a_bad_checkpoint_is_refused_before_anything_changes(case, message, scratch):
    from conftest import run_snippet as run_one
    ckpt = str(scratch / "ckpt")
    code, out = run_one(BAD.format(ckpt=ckpt, case=case))
    assert code == 0, out
    assert "ERROR " in out and message.format(f=os.path.join(ckpt, "good", "rank0.bin")) in out, out
    assert "unchanged True" in out


def test_consolidate_gives_an_ordinary_state_dict_with_tied_names(scratch):
    """A stage-3 checkpoint of 2 ranks becomes one state_dict that torch.load opens and
    load_state_dict (strict) accepts, tied weights under both names, values as saved."""
    import models
    import zeroshard
    ckpt, out = str(scratch / "ckpt"), str(scratch / "hf")
    config = config_for(3, "none", scratch)
    run_ranks([WORKER, "zs", "hf", "6", out, json.dumps(config)], 2, out,
              extra_env={"ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "5", "ZS_CKPT_STOP": "1",
                         "ZS_DUMP_PARAMS": "1"})
    saved = torch.load(f"{out}.rank0.pt")
    assert zeroshard.consolidate(ckpt, str(scratch / "full.pt")) == len(saved)
    full = torch.load(str(scratch / "full.pt"))
    assert set(full) == set(saved) and "lm_head.weight" in full and "embed_tokens.weight" in full
    for name in saved:
        assert torch.equal(full[name], saved[name]), name
    model = models.make("hf")
    model.load_state_dict(full, strict=False)  # buffers aside, every parameter name fits
    missing = [n for n, _ in model.named_parameters() if n not in full]
    assert not missing
    assert zeroshard.consolidate(ckpt, str(scratch / "per"), dtype="bf16", per_tensor=True)
    index = json.load(open(scratch / "per" / "index.json"))
    t = torch.load(str(scratch / "per" / index["lm_head.weight"]))
    assert t.dtype == torch.bfloat16 and torch.equal(t, saved["lm_head.weight"].to(torch.bfloat16))


CONSOLIDATE_RSS = """
import resource, sys, torch, zeroshard
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
zeroshard.consolidate(sys.argv[1], sys.argv[2])
print('grew_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""


def test_consolidate_streams_one_parameter_at_a_time(scratch):
    """Peak memory beyond the output is about one parameter, not the shards."""
    from conftest import run_snippet as run_one
    import subprocess
    import sys
    ckpt = str(scratch / "ckpt")
    code, out = run_one(
        "m = torch.nn.Module()\n"
        "m.blocks = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(40))\n"
        "def fwd(x):\n    for b in m.blocks: x = b(x)\n    return x.sum()\n"
        "m.forward = fwd\n"
        "engine, *_ = zeroshard.initialize(model=m, config={'zero_optimization': {'stage': 3}})\n"
        f"engine.save_checkpoint({ckpt!r}, 'big')\n")
    assert code == 0, out
    output_kib = 40 * (512 * 512 + 512) * 4 // 1024  # 41 MiB of fp32 parameters
    r = subprocess.run([sys.executable, "-c", CONSOLIDATE_RSS, ckpt, str(scratch / "big.pt")],
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(BUILD_DIR, "python")))
    assert r.returncode == 0, r.stderr
    grew = int(r.stdout.split()[-1])
    one_param_kib = 512 * 512 * 4 // 1024
    # The output, two copies of one parameter in flight, and 24 MiB for the interpreter's
    # own growth; holding the master, m and v shards would take 3x the output.
    assert grew <= output_kib + 2 * one_param_kib + 24 * 1024, (grew, output_kib)


def test_a_checkpoint_saved_inside_an_accumulation_window_resumes_at_its_place(scratch):
    """Accumulation 3, saved after one micro-step: the loaded engine's next two step()s
    finish that window (is_gradient_accumulation_boundary() as DeepSpeed counts it),
    the first of them without stepping the optimizer."""
    from conftest import run_snippet as run_one
    code, out = run_one(f"""
config = {{"gradient_accumulation_steps": 3, "zero_optimization": {{"stage": 2}}}}
def micro_step(engine):
    engine.backward(engine(torch.ones(2, 4)).square().sum())
    before = engine.is_gradient_accumulation_boundary()
    return before, engine.step()
engine, *_ = zeroshard.initialize(model=model, config=config)
micro_step(engine)
engine.save_checkpoint({str(scratch)!r})
fresh, *_ = zeroshard.initialize(model=torch.nn.Sequential(torch.nn.Linear(4, 4)), config=config)
fresh.load_checkpoint({str(scratch)!r})
print("BOUNDARY", fresh.is_gradient_accumulation_boundary(), micro_step(fresh), micro_step(fresh),
      fresh.global_steps)
""")
    assert code == 0, out
    assert "BOUNDARY False (False, False) (True, True) 1" in out, out
