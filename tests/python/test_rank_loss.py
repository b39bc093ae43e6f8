"""A rank lost with SIGKILL at points spread over forward, backward, the optimizer step
(in RAM, on the host, on NVMe), checkpoint save and load: every survivor exits non-zero
within comm_timeout_seconds, naming the lost rank, and the next start finds nothing
stale it takes for its own. A rank that is only slow (2 s) trips nothing.
The points are the named fault points of common/FaultPoint.h. On the oldest-torch leg
one kill per phase runs (both_legs in conftest.py), with each way of losing rank 0."""
import json
import os
import subprocess
import threading
import time

import pytest

import forkserver
from conftest import (HERE, both_legs, checkpoint_config as config_for, free_port, rank_env,
                      run_ranks)

WORKER = os.path.join(HERE, "train_worker.py")
STEPS = 6
TIMEOUT = 10  # comm_timeout_seconds of these runs
WORLD = 2

CONFIGS = {"z1": (1, "none"), "z2": (2, "none"), "z3": (3, "none"), "z2cpu": (2, "cpu"),
           "z3nvme": (3, "nvme")}

# (config, point@hit, rank killed). The gpt model has 2 stage-3 units, none persistent; the nvme configs
# split the optimizer state into sub-groups of 1000 elements.
KILLS = [
    ("z3", "forward.gather@1", 1), ("z3", "forward.gather@5", 0),
    ("z3", "forward.release@3", 1), ("z3nvme", "forward.gather@4", 1),
    ("z2", "backward.begin@2", 1), ("z3", "backward.gather@2", 0),
    ("z2", "backward.reduce@3", 1), ("z1", "backward.reduce@2", 0),
    ("z3", "backward.end@2", 1), ("z3nvme", "backward.reduce@4", 1),
    ("z1", "step.norm@2", 1), ("z2", "step.update@2", 0), ("z3", "step.gather@2", 1),
    ("z3", "step.schedule@1", 1), ("z2cpu", "step.cpu_group@3", 1),
    ("z3nvme", "step.update@2", 1), ("z3nvme", "step.nvme_sub_group@3", 1),
    ("z3nvme", "step.nvme_sub_group@9", 0), ("z3nvme", "nvme.param_write@2", 1),
    ("z3nvme", "nvme.param_read@4", 0),
    ("z3", "save.begin@1", 1), ("z3", "save.rank_file@1", 1),
    ("z3nvme", "save.rank_file@1", 0), ("z2", "save.publish@1", 1),
    ("z3", "save.manifest@1", 0), ("z3", "save.latest@1", 0),
]
# One per phase, and rank 0 lost in backward, on NVMe and in a save.
ON_BOTH_LEGS = {("z3", "forward.gather@1", 1), ("z3", "backward.gather@2", 0),
                ("z2", "backward.reduce@3", 1), ("z2cpu", "step.cpu_group@3", 1),
                ("z3nvme", "step.nvme_sub_group@3", 1), ("z3nvme", "nvme.param_read@4", 0),
                ("z2", "save.publish@1", 1), ("z3", "save.manifest@1", 0)}
KILL_CASES = [(both_legs if k in ON_BOTH_LEGS else pytest.param)(
                  *k, id=f"{k[0]}-{k[1].replace('@', '-')}-rank{k[2]}") for k in KILLS]


def config(name, scratch):
    stage, offload = CONFIGS[name]
    cfg = dict(config_for(stage, offload, scratch), comm_timeout_seconds=TIMEOUT)
    if stage == 3:  # every unit released after use, so backward gathers again
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    return cfg


def run_timed(args, env):
    """Starts WORLD ranks; returns [(exit status, log, seconds until it exited)]."""
    port = free_port()
    start = time.monotonic()
    procs = [forkserver.start(args, dict(rank_env(r, WORLD, port), **env)) for r in range(WORLD)]
    results = [None] * WORLD

    def collect(r):
        try:
            log = procs[r].communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            procs[r].kill()
            log = procs[r].communicate()[0] + "\n[test: still running after 120 s, killed]"
        results[r] = (procs[r].returncode, log, time.monotonic() - start)

    threads = [threading.Thread(target=collect, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def swap_dirs(scratch):
    return [d for d in os.listdir(scratch / "nvme") if d.startswith("zeroshard-swap-")]


def names_the_lost_rank(log, lost):
    if lost == 0:  # rank 0 hosts the store, so the roll-call itself fails
        return "rank 0, which hosts the rendezvous store, is gone" in log
    return f"rank(s) {lost} did not respond" in log


@pytest.mark.parametrize("name,point,lost", KILL_CASES)
def test_survivors_stop_naming_the_lost_rank(name, point, lost, scratch):
    cfg = config(name, scratch)
    ckpt = str(scratch / "ckpt")
    env = {"ZS_TEST_KILL_AT": point, "ZS_TEST_KILL_RANK": str(lost), "ZS_CKPT_DIR": ckpt}
    if point.startswith("save."):
        env["ZS_CKPT_SAVE_AT"] = "2"
    out = str(scratch / "killed")
    results = run_timed([WORKER, "zs", "gpt", str(STEPS), out, json.dumps(cfg)], env)
    code, log, killed_at = results[lost]
    assert code == -9, f"rank {lost} was to be killed at {point}:\n{log[-2000:]}"
    assert f"killed at {point}" in log
    for r in range(WORLD):
        if r == lost:
            continue
        code, log, ended = results[r]
        assert code not in (0, -9), f"survivor rank {r} exited {code}:\n{log[-3000:]}"
        assert names_the_lost_rank(log, lost), f"rank {r} did not name rank {lost}:\n{log[-3000:]}"
        assert ended - killed_at < TIMEOUT, f"rank {r} took {ended - killed_at:.1f} s to stop"
    # The next start in the same places: it neither trips over nor reuses what the dead
    # run left (its swap directories, a half-written checkpoint), and leaves nothing. Only
    # runs that write files (NVMe, a save) can leave any: the others have nothing to find.
    if CONFIGS[name][1] != "nvme" and not point.startswith("save."):
        assert not os.listdir(scratch / "nvme") and not os.path.exists(ckpt)
        return
    again = str(scratch / "again")
    resume = {"ZS_CKPT_LOAD": ckpt} if os.path.exists(os.path.join(ckpt, "latest")) else {}
    run_ranks([WORKER, "zs", "gpt", "2", again, json.dumps(cfg)], WORLD, again,
              extra_env=resume)
    assert not swap_dirs(scratch), swap_dirs(scratch)


@pytest.mark.parametrize("name,point", [("z2", "backward.reduce@2"),
                                        both_legs("z3", "forward.gather@3"),
                                        ("z3nvme", "step.nvme_sub_group@2"),
                                        ("z3", "save.rank_file@1")])
def test_a_rank_that_is_only_slow_trips_nothing(name, point, scratch):
    """One rank pauses 2 s under a 3 s timeout: the run completes with the same losses."""
    cfg = dict(config(name, scratch), comm_timeout_seconds=3)
    env = {"ZS_CKPT_DIR": str(scratch / "ckpt"), "ZS_CKPT_SAVE_AT": "2"}
    steady = run_ranks([WORKER, "zs", "gpt", str(STEPS), str(scratch / "steady"),
                        json.dumps(cfg)], WORLD, str(scratch / "steady"), extra_env=env)
    env.update(ZS_TEST_PAUSE_AT=point, ZS_TEST_PAUSE_SECONDS="2", ZS_TEST_KILL_RANK="1",
               ZS_CKPT_DIR=str(scratch / "ckpt2"))
    results = run_timed([WORKER, "zs", "gpt", str(STEPS), str(scratch / "slow"),
                         json.dumps(cfg)], env)
    for r, (code, log, _) in enumerate(results):
        assert code == 0, f"rank {r} exited {code}:\n{log[-3000:]}"
    assert f"rank 1 paused 2 s at {point}" in results[1][1]
    slow = []
    for r in range(WORLD):
        with open(f"{scratch / 'slow'}.rank{r}.json") as f:
            slow.append(json.load(f))
    assert slow == steady
