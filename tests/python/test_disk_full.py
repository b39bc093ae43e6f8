"""A full disk under nvme_path and under the checkpoint directory, made real: a
size-limited tmpfs mounted for the test (the test skips, saying why, where this process
may not mount). Start-up with too little swap space fails before training with the bytes
needed and free; a save that runs out of space fails naming its file, leaves no partial
file behind, and the previous checkpoint stays the latest and loads."""
import json
import os
import subprocess

import pytest

from conftest import HERE, run_ranks
from conftest import checkpoint_config as config_for

WORKER = os.path.join(HERE, "train_worker.py")


@pytest.fixture
def small_fs(tmp_path):
    """mount(bytes) -> a directory on a tmpfs of that size; unmounted after the test."""
    mounted = []

    def mount(size):
        where = tmp_path / f"small{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                            str(where)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a size-limited tmpfs here: {r.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_too_little_swap_space_fails_before_training(small_fs, scratch):
    nvme = small_fs(64 * 1024)
    config = config_for(3, "nvme", scratch)
    for key in ("offload_optimizer", "offload_param"):
        config["zero_optimization"][key]["nvme_path"] = str(nvme)
    out = str(scratch / "nospace")
    results = run_ranks([WORKER, "zs", "gpt", "4", out, json.dumps(config)], 2, out,
                        expect_ok=False, timeout=120)
    for r, (code, log) in enumerate(results):
        assert code != 0, log[-2000:]
        assert not os.path.exists(f"{out}.rank{r}.json"), "it trained"
    logs = "".join(log for _, log in results)
    assert "No space left on device" in logs and "free there" in logs, logs[-3000:]
    assert "cannot reserve" in logs, logs[-3000:]
    leftovers = [n for d, _, files in os.walk(nvme) for n in files if n.endswith(".swap")]
    assert not leftovers, leftovers


def test_a_save_that_runs_out_of_space_keeps_the_previous_checkpoint(small_fs, scratch):
    config = dict(config_for(3, "none", scratch), comm_timeout_seconds=10)
    # One save's size, measured: then a disk with room for that and half of another.
    probe = str(scratch / "probe")
    run_ranks([WORKER, "zs", "gpt", "2", str(scratch / "p"), json.dumps(config)], 2,
              str(scratch / "p"), extra_env={"ZS_CKPT_DIR": probe, "ZS_CKPT_SAVE_AT": "1"})
    one = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(probe) for f in fs)
    ckpt = small_fs(((one * 3 // 2) // 4096 + 1) * 4096)
    out = str(scratch / "full")
    results = run_ranks([WORKER, "zs", "gpt", "8", out, json.dumps(config)], 2, out,
                        extra_env={"ZS_CKPT_DIR": str(ckpt), "ZS_CKPT_SAVE_AT": "2,4"},
                        expect_ok=False, timeout=120)
    logs = "".join(log for _, log in results)
    for r, (code, log) in enumerate(results):
        assert code != 0, f"rank {r}:\n{log[-2000:]}"
        # each rank stops on its own error or on hearing of the other's
        assert "saving checkpoint 'global_step4' failed" in log, f"rank {r}:\n{log[-2000:]}"
    assert "No space left on device" in logs, logs[-3000:]
    assert "global_step4/rank" in logs and "free there" in logs, logs[-3000:]
    assert open(os.path.join(ckpt, "latest")).read().strip() == "global_step2"
    partial = [f for f in os.listdir(os.path.join(ckpt, "global_step4")) if f.endswith(".tmp")]
    assert not partial, partial
    resumed = str(scratch / "resumed")
    losses = run_ranks([WORKER, "zs", "gpt", "4", resumed, json.dumps(config)], 2, resumed,
                       extra_env={"ZS_CKPT_LOAD": str(ckpt)})
    whole = run_ranks([WORKER, "zs", "gpt", "4", str(scratch / "w"), json.dumps(config)], 2,
                      str(scratch / "w"))
    assert [l[-2:] for l in losses] == [l[-2:] for l in whole]
