"""communication_data_type (DeepSpeed's key) on 2 real ranks: the gradients are reduced
in the dtype it names at every stage, with and without overlap_comm and with the
optimizer offloaded, and unset they are summed in fp32. One step of SGD at lr 1 makes
the update the reduced gradient itself, which must equal, bit for bit, the mean of the
two ranks' gradients (each computed here by plain torch) rounded as that dtype rounds
them. Reduced in 16 bits, a step sends half the gradient bytes."""
import json
import os

import pytest
import torch

import models
from conftest import HERE, run_ranks

WORKER = os.path.join(HERE, "reduce_dtype_worker.py")
WORLD = 2
BUCKET = 2000  # elements: several groups, so reductions in flight wait for each other
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def config(stage, wire=None, **zero):
    z = dict({"stage": stage, "reduce_bucket_size": BUCKET}, **zero)
    if stage == 3:
        z["stage3_param_persistence_threshold"] = 0
    c = {"zero_optimization": z}
    if wire:
        c["communication_data_type"] = wire
    return c


RUNS = [
    (config(0), None),
    (config(0, "bf16"), "bf16"),
    (config(1), None),
    (config(1, "bf16", overlap_comm=True), "bf16"),
    (config(1, "fp32"), None),
    (config(2), None),
    (config(2, "bf16"), "bf16"),
    (config(2, "fp16", overlap_comm=True), "fp16"),
    (config(2, "bf16", offload_optimizer={"device": "cpu"}), "bf16"),
    (config(3), None),
    (config(3, "bf16"), "bf16"),
]


def mean_reduced(grads, wire):
    """The two ranks' gradients summed as `wire` sums them (None: in fp32), then
    averaged in fp32."""
    if wire is None:
        return (grads[0] + grads[1]) / WORLD
    dt = DTYPES[wire]
    return (grads[0].to(dt).float() + grads[1].to(dt).float()).to(dt).float() / WORLD


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("reduce_dtype") / "run")
    sent = run_ranks([WORKER, out, json.dumps([c for c, _ in RUNS])], WORLD, out, timeout=600)
    grads = [torch.load(f"{out}.rank{r}.grads.pt") for r in range(WORLD)]
    params = [torch.load(f"{out}.rank0.{i}.pt") for i in range(len(RUNS))]
    return sent, grads, params


@pytest.mark.parametrize("index", range(len(RUNS)),
                         ids=[f"stage{c['zero_optimization']['stage']}-{w or 'unset'}-{i}"
                              for i, (c, w) in enumerate(RUNS)])
def test_step_is_the_gradient_reduced_in_that_dtype(runs, index):
    _, grads, params = runs
    _, wire = RUNS[index]
    start = models.make("gpt").state_dict()
    rounded_apart = 0
    for name, p0 in start.items():
        pair = [grads[r][name] for r in range(WORLD)]
        want = p0 - mean_reduced(pair, wire)
        got = params[index][name]
        assert torch.equal(got, want), \
            f"{RUNS[index][0]}: {name} off by {(got - want).abs().max().item()}"
        rounded_apart += int((mean_reduced(pair, wire) != mean_reduced(pair, None)).sum())
    if wire is not None:  # the two sums part, so the test tells them apart
        assert rounded_apart > 1000, rounded_apart


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_16_bit_reduction_sends_half_the_gradient_bytes(runs, stage):
    sent, grads, _ = runs
    numel = sum(g.numel() for g in grads[0].values())
    unset = next(i for i, (c, w) in enumerate(RUNS)
                 if c["zero_optimization"]["stage"] == stage and w is None)
    bf16 = next(i for i, (c, w) in enumerate(RUNS)
                if c["zero_optimization"]["stage"] == stage and w == "bf16")
    # A ring sends (d-1)/d of the buffer: all-reduce twice, reduce-scatter once.
    times = 2 if stage == 0 else 1
    saved = (sent[0][unset] - sent[0][bf16]) * WORLD / (WORLD - 1)
    assert numel * 2 * times <= saved <= numel * 2 * times * 1.05, (sent[0], numel)
