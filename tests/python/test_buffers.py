"""Module buffers kept in step across 2 real ranks as torch DDP keeps them: a CNN with
BatchNorm trained on data whose statistics differ per rank (tests/python/buffers_worker.py,
every case in one process per rank).
- stages 0-3, with the optimizer on the host too, and with gradient accumulation (DDP's
  no_sync on the first micro-batch): every rank's parameters and buffers are DDP's on that
  rank, and every rank evaluates alike (DDP's outputs);
- broadcast_buffers false: each rank keeps its own, as DDP with broadcast_buffers=False;
- SyncBatchNorm (stages 1 and 3, on the host, where torch's own refuses to run) equals
  one process training on every rank's batch at once;
- a stage-3 checkpoint resumes bit-exactly, buffers too, and consolidates with them; a
  model without those buffers is refused naming one;
- the ledger counts the buffers' bytes, and the Planner predicts them."""
import json
import os

import pytest

from conftest import HERE, run_ranks

WORKER = os.path.join(HERE, "buffers_worker.py")
WORLD = 2
TOL = 2e-5
# Persistent and not: 2 norms x (running_mean 8 + running_var 8) fp32, 2 int64 counters,
# pixel_mean 3 fp32.
BUFFER_BYTES = 2 * (8 + 8) * 4 + 2 * 8 + 3 * 4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("buffers")
    out = str(scratch / "out")
    run_ranks([WORKER, out, str(scratch)], WORLD, out, timeout=600)
    ranks = []
    for r in range(WORLD):
        with open(f"{out}.rank{r}.json") as f:
            ranks.append(json.load(f))
    return ranks


def flat(tree):
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in flat(tree[k])]
    if isinstance(tree, list):
        return [x for t in tree for x in flat(t)]
    return [float(tree)]


def assert_close(got, want, what):
    a, b = flat(got), flat(want)
    assert len(a) == len(b), what
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= TOL * max(1.0, max(abs(y) for y in b)), f"{what}: off by {worst}"


def assert_like(case, reference, ranks):
    for r, got in enumerate(ranks):
        for part in ("params", "buffers", "eval", "buffers_after_eval"):
            assert_close(got[case][part], got[reference][part], f"rank {r} {case} {part}")


def test_the_ranks_really_differ_without_broadcast(results):
    """The data makes the ranks' statistics differ: DDP's ranks 0 and 1 hold different
    running means after a training forward, and without broadcast evaluate differently."""
    r0, r1 = results[0]["ddp_off"], results[1]["ddp_off"]
    assert max(abs(a - b) for a, b in zip(flat(r0["buffers"]), flat(r1["buffers"]))) > 0.1
    assert max(abs(a - b) for a, b in zip(flat(r0["eval"]), flat(r1["eval"]))) > 1e-3


@pytest.mark.parametrize("case", ["zs0", "zs1", "zs2", "zs3", "zs2cpu", "zs3cpu"])
def test_buffers_follow_ddp_on_every_rank(results, case):
    assert_like(case, "ddp", results)
    assert_close(results[1][case]["eval"], results[0][case]["eval"], f"{case}: ranks evaluate")


def test_accumulation_broadcasts_once_per_step_as_ddp_with_no_sync(results):
    assert_like("zs3_acc", "ddp_acc", results)


def test_broadcast_buffers_false_keeps_each_ranks_own(results):
    assert_like("zs2_off", "ddp_off", results)


@pytest.mark.parametrize("case", ["zs1_sync", "zs3_sync"])
def test_sync_batchnorm_is_batchnorm_over_every_ranks_batch(results, case):
    for r, got in enumerate(results):
        for part in ("params", "buffers", "eval"):
            assert_close(got[case][part], got["sync_reference"][part], f"rank {r} {case} {part}")


def test_resume_is_bit_exact_for_buffers_and_consolidates_them(results):
    for r in range(WORLD):
        assert results[r]["checkpoint"]["same_buffers"], f"rank {r}: buffers after resume"
        assert results[r]["checkpoint"]["same_params"], f"rank {r}: parameters after resume"
        assert "has buffer 'blocks.0.norm.running_mean', which the model does not have" \
            in results[r]["checkpoint"]["refused"]
    c = results[0]["checkpoint"]
    assert c["consolidated_keys"] == c["model_keys"]  # buffers in, non-persistent ones out
    assert c["consolidated_buffers_are_rank0s"]


@pytest.mark.parametrize("case", ["zs0", "zs3", "zs3cpu"])
def test_ledger_and_planner_count_the_buffers(results, case):
    for r in range(WORLD):
        assert results[r][case]["ledger_buffers"] == [BUFFER_BYTES, BUFFER_BYTES]
