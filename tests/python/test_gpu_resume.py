"""A checkpoint saved where the model lives resumes bit-exactly (gpu_resume_worker.py):
on the CPU always, on a GPU where one is visible. On a GPU the frozen parameter's values
are device memory that the checkpoint writer must bring to the host first."""
import os

import pytest
import torch

from conftest import HERE, run_ranks

WORKER = os.path.join(HERE, "gpu_resume_worker.py")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU visible (torch.cuda.is_available() is False)"))]


@pytest.mark.parametrize("offload", ["none", "cpu"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_resumes_bit_exactly_where_the_model_lives(device, offload, scratch):
    out = str(scratch / f"resume-{device}-{offload}")
    got = run_ranks([WORKER, device, offload, str(scratch), out], 1, out)[0]
    assert got["resumed"] == got["straight"]  # exact: the same arithmetic in the same order
    assert "position.weight" in got["params"]  # the frozen parameter went through the file
    assert got["differ"] == []
