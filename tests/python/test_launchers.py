"""Jobs started by the launchers themselves (tests/python/launchers.py): Open MPI's mpirun,
Slurm's srun and the `zeroshard` command with a hostfile (over ssh) start 2 hosts x 2
ranks on namespace hosts, Python scripts and the C++
engine alike, with no rank variable set by hand. The ranks find each other from what the
launcher set (mpirun's address and job id, Slurm's node list and job id), count the ranks
on their host from it, and with mics_shard_size auto shard inside each host: they train
to DDP's losses (single-process C++ training's parameters) and only the gradient shards'
all-reduce crosses between hosts. Skipped, with the reason, where namespaces cannot be
made or a launcher is not installed."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import (BUILD, HERE, HOSTS, PER_HOST, ROOT, WIDE_STEPS, WIDE_WORLD as WORLD,
                      assert_same, ddp_wide_losses as ddp_on_one_host, wide_model_params,
                      with_reference_optimizer)
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import launchers  # noqa: E402
import netns  # noqa: E402

_why = netns.unavailable() or launchers.unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=str(_why))

WORKER = os.path.join(HERE, "train_worker.py")
ENGINE_WORKER = os.path.join(BUILD, "tests", "engine_worker")
# The C++ scenario (tests/engine/TestModels.h): a transformer at stage 3, sharded inside
# each host; the reference is the same global batch trained by one process.
SCENARIO = ["model=transformer", "steps=6", "batch=8", "bucket=2000"]
TIMEOUT = 300


def run(cmd, env, what):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{what} exited {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"


def python_job(prefix, env, scratch, name):
    """Trains the wide model at stage 3 with mics_shard_size auto from `prefix` (a
    launcher's command); each rank's losses."""
    zero = {"stage": 3, "mics_shard_size": "auto"}
    cfg = with_reference_optimizer({"zero_optimization": zero}, scratch)
    out = str(scratch / name)
    env = dict(env, PYTHONPATH=os.path.join(BUILD, "python"), ZS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    run(prefix + [sys.executable, WORKER, "zs", "wide", str(WIDE_STEPS), out, json.dumps(cfg)],
        env, name)
    got = []
    for r in range(WORLD):
        with open(f"{out}.rank{r}.json") as f:
            got.append(json.load(f))
    return got


def engine_job(prefix, env, scratch, name):
    out = str(scratch / name)
    run(prefix + [ENGINE_WORKER, out, "stage=3", f"mics={PER_HOST}"] + SCENARIO, env, name)
    return [read_engine_output(f"{out}.rank{r}.pt") for r in range(WORLD)]


def read_engine_output(path):
    """engine_worker's file: the parameters, then per-step statistics, then memory."""
    with warnings.catch_warnings():  # torch.jit.load: deprecated, and torch::save's format
        warnings.simplefilter("ignore", DeprecationWarning)
        tensors = list(torch.jit.load(path).parameters())
    return tensors[:-2], tensors[-2].view(-1, 4)


@pytest.fixture(scope="module")
def single_process_engine(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("reference") / "one")
    run([ENGINE_WORKER, out, "stage=0"] + SCENARIO, launchers.clean_env(), "one process")
    return read_engine_output(f"{out}.rank0.pt")


def assert_engine_equal(ranks, want):
    params, stats = want
    for got_params_, _ in ranks:
        assert len(got_params_) == len(params)
        for g, w in zip(got_params_, params):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    # Each rank's loss is its quarter of the batch's: their mean is the whole batch's.
    mean_loss = torch.stack([s[:, 3] for _, s in ranks]).mean(0)
    torch.testing.assert_close(mean_loss, stats[:, 3], rtol=0, atol=1e-5)


def assert_grouped_by_host(h, scratch):
    """With shards inside each host, host 1 sends its gradient shards' all-reduce (the
    parameters' bytes a step) and little else (test_hosts.py derives the bound)."""
    sent, _ = h.link_bytes(1)
    param_bytes = 4 * wide_model_params()
    assert sent <= 1.1 * WIDE_STEPS * param_bytes, (sent, param_bytes)


def test_mpirun_starts_python_and_cpp_ranks_across_hosts(scratch, single_process_engine):
    want = ddp_on_one_host(scratch)
    with netns.hosts(HOSTS, "10gbit") as h:
        prefix = launchers.mpirun(h, PER_HOST, str(scratch))
        got = python_job(prefix, launchers.clean_env(), scratch, "mpirun-py")
        assert_grouped_by_host(h, scratch)
        engine = engine_job(prefix, launchers.clean_env(), scratch, "mpirun-cpp")
    assert_same(got, want, WIDE_STEPS)
    assert_engine_equal(engine, single_process_engine)


def test_srun_starts_python_and_cpp_ranks_across_hosts(scratch, single_process_engine):
    want = ddp_on_one_host(scratch)
    with netns.hosts(HOSTS, "10gbit") as h, launchers.slurm(h, PER_HOST, str(scratch)) as (
            srun, env):
        prefix = srun + ["-N", str(HOSTS), "-n", str(WORLD)]
        got = python_job(prefix, env, scratch, "srun-py")
        assert_grouped_by_host(h, scratch)
        engine = engine_job(prefix, env, scratch, "srun-cpp")
    assert_same(got, want, WIDE_STEPS)
    assert_engine_equal(engine, single_process_engine)


def test_the_zeroshard_command_starts_the_hosts_of_a_hostfile_over_ssh(scratch):
    """DeepSpeed's way: `zeroshard --hostfile H` on the first host logs into each host of
    the hostfile (its own too) and starts that host's ranks there; a rank failing on one
    host stops the other host's, and its status is the command's."""
    want = ddp_on_one_host(scratch)
    with netns.hosts(HOSTS, "10gbit") as h, launchers.ssh(h, str(scratch)) as (env, hostfile):
        zeroshard = [sys.executable, "-m", "zeroshard", "--hostfile", hostfile]
        prefix = h.login(0) + zeroshard + ["--no_local_rank", "--no_python"]
        got = python_job(prefix, env, scratch, "ssh-py")
        assert_grouped_by_host(h, scratch)
        failing = scratch / "fails.py"
        failing.write_text("import os, sys, time\n"
                           "if os.environ['RANK'] == '3': sys.exit(3)\n"
                           "time.sleep(120)\n")
        r = subprocess.run(h.login(0) + zeroshard + ["--no_local_rank", str(failing)],
                           env=dict(env, PYTHONPATH=os.path.join(BUILD, "python")),
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert_same(got, want, WIDE_STEPS)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"host {h.names[1]} exited with status 3; stopping the other 1 host(s)" in r.stderr


def test_mpirun_without_rank_0_on_its_host_names_the_fix(scratch):
    """mpirun on host 0 placing rank 0 on host 1: rank 0 says where the rendezvous
    address came from and what to set, and the job stops instead of hanging."""
    with netns.hosts(HOSTS, "10gbit") as h:
        rankfile = scratch / "rankfile"  # mpirun would put rank 0 on its own host
        rankfile.write_text("".join(f"rank {r}={h.names[1 - r // PER_HOST]} slot={r % PER_HOST}\n"
                                    for r in range(WORLD)))
        prefix = launchers.mpirun(h, PER_HOST, str(scratch)) + ["--rankfile", str(rankfile)]
        cmd = prefix + [ENGINE_WORKER, str(scratch / "x"), "stage=1", "timeout=20"] + SCENARIO
        r = subprocess.run(cmd, env=launchers.clean_env(), capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert r.returncode != 0
    assert "is not an address of rank 0's host" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "mpirun's host (OMPI_MCA_orte_hnp_uri)" in r.stdout + r.stderr
