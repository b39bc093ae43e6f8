"""DeepSpeed's pipeline API with the imports switched (zeroshard.pipe): one script
(tests/python/pipe_module_worker.py: a small language model as layers, its embedding a
TiedLayerSpec reused as the output head, PipelineModule(num_stages=2), train_batch) run by
DeepSpeed itself at ZeRO-1 (its CPU accelerator over Gloo, the reference) and by zeroshard at
ZeRO 1, 2 and 3 (DeepSpeed's pipeline engine refuses 2 and 3), on PP2 (2 ranks) and
PP2 x DP2 (4 ranks): the layer boundaries, every step's returned loss, the global gradient
norm, the tied embedding (equal on both stages) and eval_batch's loss as DeepSpeed's, within
1e-5."""
import importlib.util
import json
import os

import pytest

from conftest import HERE, both_legs, run_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.pipelining") is None,
    reason="torch.distributed.pipelining is not in this torch")
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is the reference")

WORKER = os.path.join(HERE, "pipe_module_worker.py")
SCRIPT = os.path.join(HERE, "pipe_script_worker.py")
STEPS = 4
_runs = {}


def run(system, world, stage, scratch):
    key = (system, world, stage)
    if key not in _runs:
        out = str(scratch / f"{system}{world}z{stage}")
        config = json.dumps({"gradient_accumulation_steps": 4,
                             "zero_optimization": {"stage": stage}})
        _runs[key] = run_ranks([WORKER, system, str(STEPS), out, config], world, out,
                               extra_env={"DS_ACCELERATOR": "cpu"})
    return _runs[key]


def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


@needs_deepspeed
@pytest.mark.parametrize("world,stage", [(2, 1), (4, 1), (4, 2), (4, 3)])
def test_a_deepspeed_pipeline_script_trains_as_deepspeed_does(world, stage, scratch):
    want = run("deepspeed", world, 1, scratch)
    got = run("zeroshard", world, stage, scratch)
    assert want[0]["parts"] == [0, 3, 7]  # 'parameters': the embedding and 2 blocks first
    for g, w in zip(got, want):
        assert (g["stage"], g["parts"]) == (w["stage"], w["parts"])
        for step in range(STEPS):
            assert close(g["losses"][step], w["losses"][step]), (step, g["losses"], w["losses"])
            assert close(g["norms"][step], w["norms"][step]), (step, g["norms"], w["norms"])
            assert close(g["tied_sums"][step], w["tied_sums"][step]), step
        assert close(g["eval_loss"], w["eval_loss"]), (g["eval_loss"], w["eval_loss"])
    # The tied copies stay one parameter: the first stage's and the last's are equal.
    assert all(r["tied_sums"] == got[0]["tied_sums"] for r in got)
    assert min(w["norms"][0] for w in want) > 0.05  # clipping active


@needs_deepspeed
@pytest.mark.parametrize("world", [2, 4])
def test_a_script_reading_the_engines_own_loader_trains_as_deepspeed_does(world, scratch):
    """tests/python/pipe_script_worker.py, a script of the shape of DeepSpeedExamples'
    pipeline example (layers with a lambda, training_data, train_batch() with no iterator),
    on PP2 and PP2 x DP2, dropout off and on: DeepSpeed's losses at every step, within 1e-5.
    Its data's pass ends inside a step: a new pass's random draw (torch's DataLoader makes
    one) comes before that micro-batch's forward, as in DeepSpeed's stage."""
    config = scratch / "ds_config.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                                  "gradient_accumulation_steps": 4,
                                  "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}))
    runs = {}
    for system in ("deepspeed", "zeroshard"):
        out = str(scratch / system)
        runs[system] = run_ranks([SCRIPT, system, "4", "0.3", out, "--deepspeed",
                                  "--deepspeed_config", str(config)], world, out,
                                 extra_env={"DS_ACCELERATOR": "cpu"})
    for got, want in zip(runs["zeroshard"], runs["deepspeed"]):
        for dropout in ("0.0", "0.3"):
            g, w = got["losses"][dropout], want["losses"][dropout]
            assert all(close(a, b) for a, b in zip(g, w)) and len(g) == len(w) == 4, \
                (dropout, g, w)
    with_dropout = runs["deepspeed"][0]["losses"]
    assert with_dropout["0.0"] != with_dropout["0.3"]  # the masks change the losses


@pytest.mark.parametrize("stage", [1, both_legs(3)])
def test_a_checkpoint_of_the_stages_resumes_with_the_tied_embedding(stage, scratch):
    """PP2 x DP2 saved after 2 of 4 train_batch steps, each stage its own part (the tied
    embedding in the first stage's, its owner's); 4 new ranks that load it give the last 2
    steps' losses, norms and tied sums, and the evaluated loss, bit for bit."""
    whole = run("zeroshard", 4, stage, scratch)
    ckpt = str(scratch / "ckpt")
    config = {"gradient_accumulation_steps": 4, "zero_optimization": {"stage": stage},
              "checkpoint": ckpt, "save_at": 2}
    for resume in (False, True):
        out = str(scratch / f"resume{resume}")
        got = run_ranks([WORKER, "zeroshard", str(STEPS), out,
                         json.dumps(dict(config, resume=resume))], 4, out)
    for g, w in zip(got, whole):
        assert g["losses"] == w["losses"][2:] and g["norms"] == w["norms"][2:], (g, w)
        assert g["tied_sums"] == w["tied_sums"][2:] and g["eval_loss"] == w["eval_loss"]


@pytest.mark.parametrize("stage", [1, both_legs(3)])
def test_a_checkpoint_loads_at_another_number_of_stages(stage, scratch):
    """Saved by 2 stages after 2 of 4 steps (2 ranks), loaded by 4 (4 ranks, the layers cut
    [0, 2, 3, 4, 7]): each stage takes its layers' parameters and optimizer state from the
    part that holds them (PipelineModule names its layers across the whole model), and the
    last 2 steps' losses, norms, the tied embedding and eval_batch's loss are the 2-stage
    run's."""
    base = {"gradient_accumulation_steps": 4, "zero_optimization": {"stage": stage}}
    whole = run_ranks([WORKER, "zeroshard", str(STEPS), str(scratch / "two"), json.dumps(base)],
                      2, str(scratch / "two"))
    ckpt = str(scratch / "ckpt")
    saving = dict(base, checkpoint=ckpt, save_at=2)
    run_ranks([WORKER, "zeroshard", str(STEPS), str(scratch / "saving"), json.dumps(saving)], 2,
              str(scratch / "saving"))
    out = str(scratch / "four")
    got = run_ranks([WORKER, "zeroshard", str(STEPS), out,
                     json.dumps(dict(saving, resume=True, stages=4))], 4, out)
    assert got[0]["parts"] == [0, 2, 3, 4, 7] and whole[0]["parts"] == [0, 3, 7]
    w = whole[0]
    for g in got:
        for step in range(2):
            assert close(g["losses"][step], w["losses"][2 + step]), (g["losses"], w["losses"])
            assert close(g["norms"][step], w["norms"][2 + step]), (g["norms"], w["norms"])
        # (None on torch 2.6, whose schedules have no eval)
        assert g["eval_loss"] == w["eval_loss"] or close(g["eval_loss"], w["eval_loss"])
    for g in (got[0], got[3]):  # the stages that hold the tied embedding
        assert all(close(a, b) for a, b in zip(g["tied_sums"], w["tied_sums"][2:]))


@needs_deepspeed
def test_partitions_are_deepspeeds():
    """The layer boundaries of 'parameters' (a linear partition of the counts) and
    'uniform', against DeepSpeed's own functions."""
    import random

    from deepspeed.runtime import utils as ds
    from zeroshard._parallel.pipe_module import partition_balanced, partition_uniform
    rng = random.Random(0)
    for _ in range(200):
        n, parts = rng.randint(1, 12), rng.randint(1, 5)
        weights = [rng.choice([0, 1, 5, 100, rng.randint(0, 10_000)]) for _ in range(n)]
        assert partition_balanced(weights, parts) == [int(p) for p in
                                                       ds.partition_balanced(weights, parts)]
        assert partition_uniform(n, parts) == [int(p) for p in ds.partition_uniform(n, parts)]


# The module's knobs that change numbers: dropout masks seeded per layer and forward
# (seed_layers), activation checkpointing every N layers (DeepSpeed's reentrant checkpoint
# by default, here of the blocks only: over the embedding's token ids it would give no
# gradient, and DeepSpeed's backward fails; non-reentrant, of every layer with parameters,
# from the config's pipeline.use_reentrant: false), and the stages given as a
# PipeDataParallelTopology.
KNOBS = {
    "dropout": {"dropout": 0.2},  # masks from the one random stream, drawn in one order
    "seeded-dropout": {"dropout": 0.2, "seed_layers": True},
    "checkpointed-reentrant": {"dropout": 0.2, "seed_layers": True, "interval": 1,
                               "checkpointable": ["Block"]},
    "checkpointed-non-reentrant": {"dropout": 0.2, "topology": True, "pipeline": {
        "activation_checkpoint_interval": 1, "use_reentrant": False}},
}


@needs_deepspeed
@pytest.mark.parametrize("knobs,stage", [("dropout", 3), ("seeded-dropout", 1), ("checkpointed-reentrant", 1),
                                         ("checkpointed-reentrant", 3),
                                         ("checkpointed-non-reentrant", 2)])
def test_seeded_and_checkpointed_layers_train_as_deepspeeds(knobs, stage, scratch):
    results = {}
    for system, zero in (("deepspeed", 1), ("zeroshard", stage)):
        out = str(scratch / f"{system}-{knobs}-{zero}")
        config = dict(KNOBS[knobs], gradient_accumulation_steps=4,
                      zero_optimization={"stage": zero})
        # 'uniform': DeepSpeed's seed_layers fails on 'parameters' (its cuts are numpy
        # integers, which random.seed refuses).
        results[system] = run_ranks([WORKER, system, str(STEPS), out, json.dumps(config),
                                     "uniform"], 2, out, extra_env={"DS_ACCELERATOR": "cpu"})
    plain = run("deepspeed", 2, 1, scratch)
    for g, w, p in zip(results["zeroshard"], results["deepspeed"], plain):
        for step in range(STEPS):
            assert close(g["losses"][step], w["losses"][step]), (step, g["losses"], w["losses"])
            assert close(g["norms"][step], w["norms"][step]), (step, g["norms"], w["norms"])
            assert close(g["tied_sums"][step], w["tied_sums"][step]), step
        assert close(g["eval_loss"], w["eval_loss"])
        # The knobs changed the numbers (dropout on: not the plain run's losses).
        assert abs(g["losses"][0] - p["losses"][0]) > 1e-4, (g["losses"], p["losses"])
        assert not g["warnings"], g["warnings"]


def test_a_reentrant_checkpoint_over_token_ids_is_said(scratch):
    """The embedding checkpointed alone by a reentrant checkpoint reads token ids: its
    parameters get no gradient from that use (DeepSpeed's own engine, given this, never
    finishes its first step: measured, 300 s). Here the step runs, the embedding trains
    through the tied head only, and a warning names the layers and the way out."""
    out = str(scratch / "embedding")
    config = {"interval": 1, "checkpointable": ["Embedding"], "gradient_accumulation_steps": 4,
              "zero_optimization": {"stage": 1}}
    got = run_ranks([WORKER, "zeroshard", "2", out, json.dumps(config), "uniform"], 2, out)
    said = got[0]["warnings"]
    assert len(said) == 1 and "stage 0's layers 0..0 are checkpointed by a reentrant" in \
        said[0] and "pipeline.use_reentrant: false" in said[0], said
    assert not got[1]["warnings"]
    assert got[0]["tied_sums"] == got[1]["tied_sums"]


def test_a_topology_zeroshard_does_not_lay_out_is_refused_by_name():
    from zeroshard import _zeroshard
    from zeroshard._parallel.pipe_topology import pipe_and_data
    from zeroshard.pipe import PipeDataParallelTopology, PipeModelDataParallelTopology, \
        ProcessTopology
    assert pipe_and_data(PipeDataParallelTopology(num_pp=2, num_dp=3), 6) == (2, 3)
    assert pipe_and_data(PipeModelDataParallelTopology(num_pp=2, num_mp=1, num_dp=2), 4) == (2, 2)
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_coord(5) == topo.ProcessCoord(pipe=1, data=0, model=1)  # model fastest
    with pytest.raises(_zeroshard.Error, match=r"axes \['pipe', 'data', 'model'\] and sizes "
                                               r"\[2, 2, 2\].*tensor parallelism"):
        pipe_and_data(topo, 8)
    with pytest.raises(_zeroshard.Error, match=r"axes \['data', 'pipe'\]"):
        pipe_and_data(ProcessTopology(axes=["data", "pipe"], dims=[2, 2]), 4)
    with pytest.raises(_zeroshard.Error, match="2 stages x 2 data-parallel ranks = 4 ranks, "
                                               "but the world has 8"):
        pipe_and_data(PipeDataParallelTopology(num_pp=2, num_dp=2), 8)
