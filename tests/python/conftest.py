"""Shared helpers: start real rank processes (the environment torchrun would give them)
and read back what each wrote."""
import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("ZS_BUILD_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))  # tests that call the package in-process

# The leg these tests run on. ./zs test runs them all against PyPI's torch (the main
# leg), then again against the oldest torch zeroshard supports (ZS_TEST_LEG=oldest, the
# trixie root). There, a parametrized test with cases marked both_legs runs only those:
# they stand for the rest on what differs between torch versions (hooks, c10d, the
# binding), while the other cases vary zeroshard's own settings, which the main leg
# covers. Tests with no case marked run whole on both legs.
OLDEST_LEG = os.environ.get("ZS_TEST_LEG") == "oldest"


def both_legs(*values, **kwargs):
    """A parametrize case that runs on the oldest-torch leg too (see OLDEST_LEG)."""
    marks = kwargs.pop("marks", ())
    marks = list(marks) if isinstance(marks, (list, tuple)) else [marks]
    return pytest.param(*values, marks=marks + [pytest.mark.both_legs], **kwargs)


def pytest_configure(config):
    config.addinivalue_line("markers", "both_legs: a case that also runs on the oldest torch")


def pytest_collection_modifyitems(config, items):
    if not OLDEST_LEG:
        return
    chosen = {item.function for item in items if item.get_closest_marker("both_legs")}
    skip = pytest.mark.skip(reason="main leg only: on the oldest torch the cases marked "
                                   "both_legs stand for this test")
    for item in items:
        if item.function in chosen and not item.get_closest_marker("both_legs"):
            item.add_marker(skip)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, world, port):
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=os.path.join(BUILD, "python"), ZS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", USE_LIBUV="0")  # Debian's torch 2.x has no libuv
    return env


def run_ranks(args, world, out, timeout=300, extra_env=None, expect_ok=True, python=None,
              cwd=None, launch=None):
    """Runs `python args...` as `world` ranks (this interpreter unless `python` names
    another); returns each rank's JSON output (with expect_ok False: each rank's (exit
    status, log)). launch(rank) may give (command prefix, environment) for a rank, as
    hosts.Hosts.launch does to run it on another host."""
    port = free_port()
    procs = []
    for r in range(world):
        prefix, env = launch(r) if launch else ([], {})
        procs.append(subprocess.Popen(
            prefix + [python or sys.executable] + args, cwd=cwd,
            env=dict(rank_env(r, world, port), **(extra_env or {}), **env),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"ranks did not finish in {timeout} s: {args}")
    if not expect_ok:
        return [(p.returncode, log) for p, log in zip(procs, logs)]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{logs[r][-3000:]}"
    results = []
    for r in range(world):
        with open(f"{out}.rank{r}.json") as f:
            results.append(json.load(f))
    return results


@pytest.fixture
def scratch(tmp_path):
    return tmp_path
