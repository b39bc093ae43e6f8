"""On a GPU (skipped where none is visible, as on CI): the copies an offloaded optimizer
makes between the GPU and the host (sharding/CopyStream.h: reduced gradients down,
updated parameters up, on streams of their own) run under torch's CUDA stream sanitizer
(TORCH_CUDA_SANITIZER: a kernel that touches a tensor before another stream's write to it
is ordered before the kernel fails the run), and give the losses of the same training
with the optimizer on the device, from the first step on. The sanitizer sees what runs
on the training thread and autograd's threads; the overlapped step's own worker thread
is outside its reach. Parameter shards kept in host RAM or on NVMe are copied up to
their gathers under it too, and an optimizer split between the GPU and the host
(offload_optimizer.ratio) steps under it."""
import os

import pytest
import torch

from conftest import HERE, run_ranks

WORKER = os.path.join(HERE, "gpu_stream_worker.py")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no GPU visible (torch.cuda.is_available() is False)")


def losses(scratch, offload, overlap, sanitize, params=None):
    out = str(scratch / f"{offload}-{overlap}-{int(sanitize)}-{bool(params)}")
    env = {"TORCH_CUDA_SANITIZER": "1"} if sanitize else {}
    args = [WORKER, "cuda", offload, overlap, out] + ([params] if params else [])
    return run_ranks(args, 1, out, extra_env=env)[0]["losses"]


@pytest.mark.parametrize("overlap", ["false", "true"])
def test_offload_copies_are_ordered_and_give_the_device_optimizers_losses(overlap, scratch):
    want = losses(scratch, "none", "false", sanitize=False)
    got = losses(scratch, "cpu", overlap, sanitize=True)
    assert got == pytest.approx(want, rel=1e-4)  # CPU Adam against the device's AdamW


@pytest.mark.parametrize("params", ["cpu", "nvme"])
def test_parameter_shards_off_the_gpu_are_ordered_and_give_the_device_optimizers_losses(
        params, scratch):
    """Each shard kept in host RAM goes up to its gather without the host waiting, and
    is written by the step only once that copy has ended; each shard read from NVMe goes
    up on a copy stream the compute stream waits for, and its staging buffer is read
    into again only once that copy has ended."""
    where = "cpu"
    if params == "nvme":
        where = str(scratch / "nvme")
        os.mkdir(where)
    want = losses(scratch, "none", "false", sanitize=False)
    got = losses(scratch, "cpu", "false", sanitize=True, params=where)
    assert got == pytest.approx(want, rel=1e-4)


def test_an_optimizer_split_between_gpu_and_host_is_ordered_and_gives_the_device_optimizers_losses(
        scratch):
    """offload_optimizer.ratio 0.5: the first blocks step on the GPU with torch's fused
    Adam, the rest on the host, whose reduced gradients alone land there."""
    want = losses(scratch, "none", "false", sanitize=False)
    got = losses(scratch, "cpu@0.5", "false", sanitize=True)
    assert got == pytest.approx(want, rel=1e-4)
