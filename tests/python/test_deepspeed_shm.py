"""tools/deepspeed_shm.py frees the shared-memory buffers DeepSpeed's runs leave in /dev/shm,
and never one a process still uses."""
import os
import subprocess
import sys
import time

import pytest

from conftest import OLDEST_LEG, ROOT, free_port, rank_env

sys.path.insert(0, os.path.join(ROOT, "tools"))
import deepspeed_shm  # noqa: E402

pytestmark = pytest.mark.skipif(OLDEST_LEG, reason="DeepSpeed is installed on the main leg only")

HOLD = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "map":
    m = mmap.mmap(fd, 4096)
    os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"""


def buffer(tag, age_s):
    path = os.path.join(deepspeed_shm.SHM, f"{deepspeed_shm.PREFIX}{os.getuid()}_test_"
                                           f"{os.getpid()}_{tag}_0")
    with open(path, "wb") as f:
        f.write(b"\0" * 8192)
    os.utime(path, (time.time() - age_s,) * 2)
    return path


def holding(path, how):
    p = subprocess.Popen([sys.executable, "-c", HOLD, path, how], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    return p


def test_only_buffers_no_process_uses_and_not_just_made_are_removed():
    mapped, opened, fresh, left = (buffer("mapped", 600), buffer("opened", 600),
                                   buffer("fresh", 0), buffer("left", 600))
    holders = [holding(mapped, "map"), holding(opened, "open")]
    try:
        count, freed = deepspeed_shm.remove_unused()
        assert count >= 1 and freed >= 8192
        assert not os.path.exists(left)
        assert os.path.exists(mapped) and os.path.exists(opened) and os.path.exists(fresh)
    finally:
        for p in holders:
            p.communicate("")
    deepspeed_shm.remove_unused()
    assert not os.path.exists(mapped) and not os.path.exists(opened)
    assert os.path.exists(fresh)
    os.unlink(fresh)


DEEPSPEED_RUN = """
import deepspeed, torch
deepspeed.init_distributed(dist_backend="gloo")
t = torch.ones(4)
deepspeed.comm.inference_all_reduce(t)
print("sum", t.tolist(), flush=True)
"""


def test_the_buffer_a_deepspeed_run_leaves_is_the_one_removed():
    port = free_port()
    env = dict(rank_env(0, 1, port), LOCAL_SIZE="1")  # all ranks local: DeepSpeed takes shm
    r = subprocess.run([sys.executable, "-c", DEEPSPEED_RUN], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "sum [1.0, 1.0, 1.0, 1.0]" in r.stdout, r.stdout + r.stderr
    # DeepSpeed's own name for it: uid, master address and port, rank.
    path = os.path.join(deepspeed_shm.SHM, f"{deepspeed_shm.PREFIX}{os.getuid()}_127.0.0.1_"
                                           f"{port}_0")
    assert os.path.exists(path), sorted(os.listdir(deepspeed_shm.SHM))
    assert os.path.getsize(path) > 64 << 20
    deepspeed_shm.remove_unused()
    assert os.path.exists(path)  # just made: a run beside this one may be setting it up
    os.utime(path, (time.time() - 2 * deepspeed_shm.MIN_AGE_S,) * 2)
    deepspeed_shm.remove_unused()
    assert not os.path.exists(path)
