"""Ranks that part from each other end with an error that names the ranks and the
difference, never a hang (docs/reliability.md):
- what they built (the model, the config, the stage-3 units) is compared through the store
  before the first collective: every rank fails in seconds, check_collectives or not;
- a collective that differs, with check_collectives: the fingerprints agreed on before each
  collective differ, and every rank fails in seconds with each rank's collective;
- a collective one rank never joins: the timeout (comm_timeout_seconds) ends it, and the
  message says what the other ranks wait on instead.
A correct run gives the same losses with check_collectives as without."""
import os

import pytest

from conftest import HERE, both_legs, run_ranks

WORKER = os.path.join(HERE, "divergence_worker.py")


def run(scratch, case, check=False, timeout=60, extra=None):
    out = str(scratch / f"{case}-{int(check)}")
    env = {"ZS_CHECK_COLLECTIVES": "1" if check else "0", "ZS_TIMEOUT": str(timeout)}
    env.update(extra or {})
    return run_ranks([WORKER, case, out], 2, out, timeout=120, extra_env=env)


@pytest.mark.parametrize("case,expected", [
    both_legs("model", ["differ from rank 0 in the parameters",
                        "at entry 1, rank 0 has 'emb.weight [64, 32] Float cpu trainable' and rank "
                        "1 has 'emb.weight [64, 48] Float cpu trainable'"]),
    ("config", ["differ from rank 0 in the config (as resolved)",
                "rank 0 has 'zero_optimization.reduce_bucket_size: 2000' and rank 1 has "
                "'zero_optimization.reduce_bucket_size: 1000'"]),
    ("units", ["differ from rank 0 in the stage-3 units",
               "at entry 2, rank 0 has 'unit 1: blocks.0.ln.weight, blocks.0.ln.bias, "
               "blocks.0.fc1.weight, blocks.0.fc1.bias, blocks.0.fc2.weight, blocks.0.fc2.bias' "
               "and rank 1 has 'unit 1: blocks.0.ln.weight", "(rank 0: 5 entries, rank 1: 3)"]),
])
def test_ranks_that_built_differently_stop_before_the_first_collective(scratch, case, expected):
    for rank in run(scratch, case):
        error = rank["error"]
        assert error is not None and rank["losses"] == []
        assert "rank(s) 1 differ from rank 0" in error, error
        for text in expected:
            assert text in error, error
        assert rank["seconds"] < 10, rank


def test_a_collective_that_differs_fails_on_every_rank_with_both_fingerprints(scratch):
    # Rank 1 leaves out its 2nd gather of the first forward (unit 1, blocks.0): its next one,
    # unit 2's (blocks.1), meets rank 0's unit 1.
    ranks = run(scratch, "skip", check=True,
                extra={"ZS_TEST_SKIP_AT": "forward.gather@2", "ZS_TEST_KILL_RANK": "1"})
    for rank in ranks:
        error = rank["error"]
        assert error is not None, rank
        assert "collectives diverged: the ranks of group 'params' issued different collectives" \
            in error, error
        assert "rank(s) 0: all-gather of" in error and "(unit 1: blocks.0." in error, error
        assert "rank(s) 1: all-gather of" in error and "(unit 2: blocks.1." in error, error
        assert rank["seconds"] < 10, rank


@pytest.mark.parametrize("check", [both_legs(False), True])
def test_a_collective_one_rank_never_joins_ends_at_the_timeout_naming_what_the_others_wait_on(
        scratch, check):
    # After step 1 rank 1 reads a parameter (a gather on the group of reads between steps);
    # rank 0 goes on to step 2's first gather. Each waits for the other until the timeout.
    timeout = 6
    waiting, reading = run(scratch, "read", check=check, timeout=timeout)
    for rank in (waiting, reading):
        assert rank["error"] is not None and len(rank["losses"]) == 1, rank
        assert "rank(s) 1 have not arrived" in waiting["error"] or \
            "rank(s) 0 have not arrived" in rank["error"], rank["error"]
        # The timeout, the roll-call (at most a third of the timeout) and slack.
        assert rank["seconds"] < 2 * timeout + 8, rank
    assert "group 'params'" in waiting["error"], waiting["error"]
    # With check_collectives each waits in the fingerprint exchange before the collective.
    assert "rank(s) 1 have not arrived; rank(s) 1 waits in " in waiting["error"]
    assert "all-gather of 4352 Float (unit 1: blocks.0.ln.weight) (#1 on group 'touches') for" \
        in waiting["error"], waiting["error"]
    assert "rank(s) 0 have not arrived; rank(s) 0 waits in " in reading["error"]
    assert "all-gather of 2048 Float (unit 0: emb.weight) (#13 on group 'params') for" \
        in reading["error"], reading["error"]


def test_an_exchange_on_a_python_made_group_one_rank_never_joins_ends_at_the_timeout(scratch):
    # The sequence-parallel groups are made before initialize: with torch's default they
    # would wait 30 minutes (Gloo); initialize gives them comm_timeout_seconds.
    timeout = 3
    waiting, sleeping = run(scratch, "exchange", timeout=timeout)
    error = waiting["error"]
    assert error is not None and sleeping["error"] is None, (waiting, sleeping)
    assert "rank 0: Ulysses' all-to-all (sequence slices to head blocks) over ranks [0, 1] failed " \
        "(comm_timeout_seconds 3)" in error, error
    assert "every rank of the group must run the same collectives in the same order" in error
    assert timeout - 1 < waiting["seconds"] < timeout + 6, waiting


def test_checking_collectives_leaves_the_numbers_as_they_were(scratch):
    plain, checked = run(scratch, "same"), run(scratch, "same", check=True)
    for a, b in zip(plain, checked):
        assert a["error"] is None and b["error"] is None
        assert len(a["losses"]) == 3 and a["losses"] == b["losses"]
