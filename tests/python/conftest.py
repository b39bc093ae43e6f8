"""Shared helpers: start real rank processes (the environment torchrun would give them)
and read back what each wrote."""
import json
import os
import subprocess
import sys

import pytest

import forkserver

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


# A test the oldest-torch leg skips whole: what it checks is zeroshard's own (a refusal's
# message, a validation, a composition of paths whose torch calls other tests run on that
# leg), the same on every torch.
main_leg_only = pytest.mark.skipif(
    OLDEST_LEG, reason="main leg only: it checks zeroshard's own logic, which does not "
                       "depend on torch's version; other tests run its torch calls here")


def pytest_configure(config):
    config.addinivalue_line("markers", "both_legs: a case that also runs on the oldest torch")


def pytest_sessionfinish(session, exitstatus):
    """DeepSpeed's reference runs leave 69 MB a rank in /dev/shm (tools/deepspeed_shm.py):
    freed after each test file, or a full run would hold some 10 GB of memory by its end."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import deepspeed_shm
    deepspeed_shm.remove_unused()


def pytest_unconfigure(config):
    """The session's objects out of the collector's sight before the interpreter exits:
    its final collection would walk every object torch (and transformers) made, about a
    second a file (tests/python/forkserver.py's frozen() says the same of the ranks)."""
    import gc
    gc.freeze()


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
    """The launcher's pick: a free port outside the kernel's ephemeral range."""
    from zeroshard._tools.launcher import free_port as pick
    return pick()


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
        env = dict(rank_env(r, world, port), **(extra_env or {}))
        if launch or python:
            prefix, host_env = launch(r) if launch else ([], {})
            procs.append(subprocess.Popen(
                prefix + [python or sys.executable] + args, cwd=cwd, env=dict(env, **host_env),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        else:
            procs.append(forkserver.start(args, env, cwd))
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


# What tests that compare with DDP share: train_worker's optimizer in a config, DDP's
# losses (run once per worker, model and length), and the comparison.
EQUIVALENCE_STEPS, EQUIVALENCE_WORLD = 20, 2
TRAIN_WORKER = os.path.join(HERE, "train_worker.py")
_ddp_reference = {}


def ddp_losses(model, scratch, worker=TRAIN_WORKER, steps=EQUIVALENCE_STEPS,
               world=EQUIVALENCE_WORLD):
    """torch DDP's losses for `model` (run once per worker, model, steps and world)."""
    key = (worker, model, steps, world)
    if key not in _ddp_reference:
        out = str(scratch / f"ddp-{model}-{steps}-{world}")
        _ddp_reference[key] = run_ranks([worker, "ddp", model, str(steps), out], world, out)
    return _ddp_reference[key]


def with_reference_optimizer(config, nvme_dir):
    """The config with train_worker's optimizer, fp32, and its nvme_path in nvme_dir."""
    config = dict(config)
    config.pop("bf16", None)
    config.pop("fp16", None)
    config.pop("scheduler", None)
    config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95],
                                                       "eps": 1e-8, "weight_decay": 0.1}}
    config["gradient_clipping"] = 1.0
    zero = dict(config.get("zero_optimization", {}))
    for key in ("offload_optimizer", "offload_param"):
        if key in zero:
            zero[key] = dict(zero[key], nvme_path=str(nvme_dir))
    if "offload_param" in zero:
        zero["offload_param"]["max_in_cpu"] = 0  # really on NVMe
    zero["sub_group_size"] = 1000  # several sub-groups: the swap pipeline runs
    config["zero_optimization"] = zero
    return config


def assert_same(got, want, steps=EQUIVALENCE_STEPS):
    for rank, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w) == steps
        for step, (a, b) in enumerate(zip(g, w)):
            assert abs(a - b) <= 1e-5 * abs(b), f"rank {rank} step {step}: zeroshard {a} DDP {b}"
        assert g[-1] < g[0], "the loss did not fall"


def checkpoint_config(stage, offload, scratch):
    """train_worker's config at `stage` with the optimizer (and at stage 3 with nvme, the
    parameters) offloaded to `offload`: none, cpu or nvme."""
    zero = {"stage": stage}
    if offload in ("cpu", "nvme"):
        zero["offload_optimizer"] = {"device": offload}
    if offload == "nvme" and stage == 3:
        zero["offload_param"] = {"device": "nvme"}
    os.makedirs(scratch / "nvme", exist_ok=True)
    return with_reference_optimizer({"zero_optimization": zero}, scratch / "nvme")


class Payload:
    """What an attacker's checkpoint holds: unpickling it calls os.mkdir(marker); loading
    a file that holds one must refuse it, and the marker must never exist."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


SNIPPET = """
import torch, zeroshard
model = torch.nn.Sequential(torch.nn.Linear(4, 4))
{body}
"""


def run_snippet(body, launched=True):
    """Runs `body` after SNIPPET's lines in a fresh interpreter, as rank 0 of 1 (or with no
    launcher's environment); returns (exit status, output)."""
    env = rank_env(0, 1, free_port()) if launched else dict(
        os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    if not launched:
        for v in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
            env.pop(v, None)
    r = subprocess.run([sys.executable, "-c", SNIPPET.format(body=body)], env=env,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


# Two hosts of two ranks (tools/bench/netns.py), training models.py's wide model. Its
# losses part from DDP's by 1.3e-5 after 16 steps (stage 2, no groups: fp32 sums in
# another order, amplified); 10 steps stay well inside 1e-5.
HOSTS, PER_HOST, WIDE_STEPS = 2, 2, 10
WIDE_WORLD = HOSTS * PER_HOST


def ddp_wide_losses(scratch):
    """DDP's losses for the wide model on WIDE_WORLD ranks of one host."""
    return ddp_losses("wide", scratch, steps=WIDE_STEPS, world=WIDE_WORLD)


def wide_model_params():
    code = ("import sys; sys.path.insert(0, %r); import models; "
            "print(sum(p.numel() for p in models.make('wide').parameters()))" % HERE)
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)


# Checkpoint tests: train_worker's GPT to step 12 unless told otherwise, its parameters
# dumped by every rank.
CHECKPOINT_STEPS = 12


def train_params(scratch, tag, config, world, env):
    """Each rank's parameters after CHECKPOINT_STEPS steps of the GPT under `config` (env:
    the worker's checkpoint switches, ZS_CKPT_*)."""
    import torch
    out = str(scratch / tag)
    run_ranks([TRAIN_WORKER, "zs", "gpt", str(CHECKPOINT_STEPS), out, json.dumps(config)], world,
              out, extra_env=dict(env, ZS_DUMP_PARAMS="1"))
    return [torch.load(f"{out}.rank{r}.pt") for r in range(world)]


def assert_params(got, want, exact):
    import torch
    for name, w in want.items():
        if exact:
            assert torch.equal(got[name], w), f"{name} differs after resume"
        else:
            diff = (got[name] - w).abs().max().item()
            assert diff <= 1e-5 * max(w.abs().max().item(), 1e-6), f"{name}: {diff}"


# A DeepSpeed script's switch to zeroshard: its import lines, nothing else.
DEEPSPEED_SWITCH = {"import deepspeed\n": "import zeroshard as deepspeed\n",
                    "import deepspeed.comm as dist": "import zeroshard.comm as dist",
                    "from deepspeed.accelerator import": "from zeroshard.accelerator import",
                    "from deepspeed.moe.utils import": "from zeroshard.moe.utils import"}


def switched_to_zeroshard(script, folder):
    """A copy of `script` in `folder` with its deepspeed imports pointed at zeroshard (each
    switch that applies; at least the first)."""
    text = open(script).read()
    assert next(iter(DEEPSPEED_SWITCH)) in text, script
    for was, now in DEEPSPEED_SWITCH.items():
        text = text.replace(was, now)
    path = folder / ("zeroshard_" + os.path.basename(script))
    path.write_text(text)
    return str(path)

