"""Stage 3 shards every parameter of every model, with no units given: Hugging Face's T5
(an encoder and a decoder stack, the embedding tied to the head), Llama, Gemma-2 (tied),
Qwen3-MoE (experts) and LLaVA (a CLIP vision tower, a projector, a Llama), built from
small configs and trained on 2 and 4 real ranks (zero3_worker.py, every model in one
process per rank).

Against the same models trained in one process on the whole batch: every step's loss
(the mean of the ranks' losses) within 1e-5, though halfway every rank reads a parameter
(whole: the value engine.state_dict() gives) and generates greedily (the tokens a plain
model given that state_dict generates). After training, per rank:
- the parameter bytes the engine holds (the ledger's device params) are each unit's
  padded shard, sum over units of 4 x round_up(ceil(n / d), 64): at most 1/d of the model
  plus 64 elements a unit (docs/memory-model.md); the model's parameter tensors point
  at nothing but one placeholder value a group;
- the ledger's peak of gathered parameters is at most two units whole;
- zeroshard-estimate from the model's config.json gives the ledger's bytes of every
  model-state kind within 2%, and so does the Planner for the live model."""
import importlib.util
import json
import math
import os
import subprocess

import pytest

from conftest import BUILD, HERE, run_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed beside this interpreter (the trixie leg): the "
           "main leg runs these tests")

WORKER = os.path.join(HERE, "zero3_worker.py")
MODELS = ("t5", "llama", "gemma2", "qwen3_moe", "llava")
STEPS = 4
CONFIG = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                          "stage3_prefetch_bucket_size": 0},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                              "weight_decay": 0.1}},
    "gradient_clipping": 1.0,
}
MODEL_STATES = ("params", "master_params", "optimizer_states", "grads", "grads_fp32")


def padded_shard(numel, ranks):
    """common/Alignment.h's padded_shard_numel: a rank's share, rounded up to 64 elements."""
    return math.ceil(math.ceil(numel / ranks) / 64) * 64


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("single") / "single")
    return run_ranks([WORKER, "single", ",".join(MODELS), str(STEPS), out], 1, out)[0]


def estimate(config_json, world, scratch):
    config = scratch / "estimate-config.json"
    config.write_text(json.dumps(CONFIG))
    out = subprocess.run(
        [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config", config_json,
         "--config", str(config), "--gpus-per-node", str(world), "--fp32", "--json"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    rows = [o for o in json.loads(out.stdout)["options"]
            if o["stage"] == 3 and o["offload_optimizer"] == "none" and o["offload_param"] == "none"]
    return rows[0]["bytes_by_kind"]["device"]


def assert_near(got, want, what):
    assert abs(got - want) <= 0.02 * want, f"{what}: {got} against {want}"


@pytest.mark.parametrize("world", [2, 4])
def test_stage3_shards_every_parameter_of_every_model(world, single, scratch):
    out = str(scratch / "zs")
    ranks = run_ranks([WORKER, "zs", ",".join(MODELS), str(STEPS), out, json.dumps(CONFIG)],
                      world, out)
    for name in MODELS:
        want = single[name]["losses"]
        for step in range(STEPS):
            mean = sum(r[name]["losses"][step] for r in ranks) / world
            assert abs(mean - want[step]) <= 1e-5 * want[step], (name, step, mean, want[step])
        for rank, r in enumerate(ranks):
            seen = r[name]["probe"]
            assert abs(seen["read"] - seen["whole"]) <= 1e-6 * abs(seen["whole"]), (name, seen)
            if "generated" in seen:
                assert seen["generated"] == ranks[0][name]["probe"]["plain"], (name, rank)
        estimated = estimate(f"{out}.{name}.config.json", world, scratch)
        for rank, r in enumerate(ranks):
            m = r[name]["memory"]
            kinds, units = m["kinds"], m["units"]
            what = f"{name} rank {rank}"
            assert sum(units) == m["parameters"], what  # every parameter in one unit
            at_rest = 4 * sum(padded_shard(n, world) for n in units)
            assert kinds["params"]["current"] == at_rest, what
            assert at_rest <= 4 * (m["parameters"] / world + 64 * len(units)), what
            assert m["held_by_parameters"] <= 4 * 2 * len(units), what  # placeholders only
            largest = max(padded_shard(n, world) for n in units) * world
            assert kinds["gathered_params"]["current"] == 0, what
            assert kinds["gathered_params"]["peak"] <= 4 * 2 * largest, what
            for kind in MODEL_STATES:
                held = kinds[kind]["current"]
                assert_near(kinds[kind]["predicted"], held, f"{what} {kind} planned")
                assert_near(estimated[kind], held, f"{what} {kind} estimated")
