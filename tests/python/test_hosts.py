"""Ranks on hosts that are really separate (tests/python/hosts.py: network namespaces on
a bridge, the link between hosts limited to 1 Gbit/s by tbf), 2 hosts x 2 ranks with the
rendezvous on the first host's address: stages 2 and 3 train to torch DDP's losses on
one host, the traffic between hosts goes over the hosts' links, and a host taken away
(its link down, its ranks killed) makes the other host's ranks stop within the timeout
and the roll-call, naming the lost ranks. Skipped, with the reason, where namespaces cannot be made."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import hosts
from conftest import HERE, free_port, rank_env, run_ranks
from test_equivalence import assert_same, with_reference_optimizer

pytestmark = pytest.mark.skipif(hosts.unavailable() is not None,
                                reason=str(hosts.unavailable()))

WORKER = os.path.join(HERE, "train_worker.py")
STEPS, HOSTS, PER_HOST = 20, 2, 2
WORLD = HOSTS * PER_HOST
_reference = {}


def ddp_on_one_host(scratch):
    if "ddp" not in _reference:
        out = str(scratch / "ddp")
        _reference["ddp"] = run_ranks([WORKER, "ddp", "gpt", str(STEPS), out], WORLD, out)
    return _reference["ddp"]


@pytest.mark.parametrize("stage", [2, 3])
def test_stages_across_hosts_equal_ddp_on_one_host(stage, scratch):
    want = ddp_on_one_host(scratch)
    cfg = with_reference_optimizer({"zero_optimization": {"stage": stage}}, scratch)
    out = str(scratch / f"zs{stage}")
    with hosts.hosts(HOSTS) as h:
        got = run_ranks([WORKER, "zs", "gpt", str(STEPS), out, json.dumps(cfg)], WORLD, out,
                        launch=h.launch(PER_HOST))
        sent, received = h.link_bytes(1)
    assert_same(got, want)
    # Each step the second host's ranks send their gradients' share (the parameters'
    # bytes, at least half of them) across; stage 3 also gathers parameters.
    param_bytes = 4 * got_params(scratch)
    assert sent >= STEPS * param_bytes / 2, (sent, param_bytes)
    assert received >= STEPS * param_bytes / 2, (received, param_bytes)


def got_params(scratch):
    code = ("import sys; sys.path.insert(0, %r); import models; "
            "print(sum(p.numel() for p in models.make('gpt').parameters()))" % HERE)
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)


def test_a_host_taken_away_stops_the_others_naming_its_ranks(scratch):
    timeout = 20
    cfg = dict(with_reference_optimizer({"zero_optimization": {"stage": 3}}, scratch),
               comm_timeout_seconds=timeout)
    out = str(scratch / "lost")
    port = free_port()
    with hosts.hosts(HOSTS) as h:
        launch = h.launch(PER_HOST)
        procs = []
        for r in range(WORLD):
            prefix, env = launch(r)
            if r >= PER_HOST:  # the second host's ranks stall in step 3 until taken away
                env.update(ZS_TEST_PAUSE_AT="forward.gather@3", ZS_TEST_PAUSE_SECONDS="600")
            procs.append(subprocess.Popen(
                prefix + [sys.executable, WORKER, "zs", "gpt", "50", out, json.dumps(cfg)],
                env=dict(rank_env(r, WORLD, port), **env), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True))
        logs = [None] * WORLD
        ended = [None] * WORLD

        def collect(r):
            try:
                logs[r] = procs[r].communicate(timeout=180)[0]
            except subprocess.TimeoutExpired:
                procs[r].kill()
                logs[r] = procs[r].communicate()[0] + "\n[test: still running after 180 s]"
            ended[r] = time.monotonic()

        threads = [threading.Thread(target=collect, args=(r,)) for r in range(WORLD)]
        for t in threads:
            t.start()
        time.sleep(8)  # started, and the first host waits on the second in step 3
        assert all(p.poll() is None for p in procs), [p.poll() for p in procs]
        h.take_away(1)
        for p in procs[PER_HOST:]:
            p.kill()
        taken = time.monotonic()
        for t in threads:
            t.join()
    for r in range(PER_HOST):
        assert procs[r].returncode not in (0, -9), f"rank {r} exited {procs[r].returncode}:\n{logs[r][-3000:]}"
        assert "rank(s) 2, 3 did not respond" in logs[r], f"rank {r}:\n{logs[r][-3000:]}"
        # A link that is down sends no reset: the collective in flight runs out its
        # timeout, then the roll-call (at most 5 s) names who is missing.
        assert ended[r] - taken < timeout + 5 + 3, f"rank {r} took {ended[r] - taken:.1f} s to stop"
