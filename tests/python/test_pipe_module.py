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

from conftest import HERE, run_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.pipelining") is None,
    reason="torch.distributed.pipelining is not in this torch")
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is the reference")

WORKER = os.path.join(HERE, "pipe_module_worker.py")
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


@pytest.mark.parametrize("stage", [1, 3])
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


@needs_deepspeed
def test_partitions_are_deepspeeds():
    """The layer boundaries of 'parameters' (a linear partition of the counts) and
    'uniform', against DeepSpeed's own functions."""
    import random

    from deepspeed.runtime import utils as ds
    from zeroshard._pipe_module import partition_balanced, partition_uniform
    rng = random.Random(0)
    for _ in range(200):
        n, parts = rng.randint(1, 12), rng.randint(1, 5)
        weights = [rng.choice([0, 1, 5, 100, rng.randint(0, 10_000)]) for _ in range(n)]
        assert partition_balanced(weights, parts) == [int(p) for p in
                                                       ds.partition_balanced(weights, parts)]
        assert partition_uniform(n, parts) == [int(p) for p in ds.partition_uniform(n, parts)]
