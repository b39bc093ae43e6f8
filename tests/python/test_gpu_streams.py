"""On a GPU (skipped where none is visible, as on CI): the copies an offloaded optimizer
makes between the GPU and the host (sharding/CopyStream.h: reduced gradients down,
updated parameters up, on streams of their own) run under torch's CUDA stream sanitizer
(TORCH_CUDA_SANITIZER: a kernel that touches a tensor before another stream's write to it
is ordered before the kernel fails the run), and give the losses of the same training
with the optimizer on the device, from the first step on. The sanitizer sees what runs
on the training thread and autograd's threads; the overlapped step's own worker thread
is outside its reach. Parameter shards on NVMe go up to their gathers the same way."""
import os

import pytest
import torch

from conftest import HERE, run_ranks

WORKER = os.path.join(HERE, "gpu_stream_worker.py")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no GPU visible (torch.cuda.is_available() is False)")


def losses(scratch, offload, overlap, sanitize, params_nvme=None):
    out = str(scratch / f"{offload}-{overlap}-{int(sanitize)}-{bool(params_nvme)}")
    env = {"TORCH_CUDA_SANITIZER": "1"} if sanitize else {}
    args = [WORKER, "cuda", offload, overlap, out] + ([params_nvme] if params_nvme else [])
    return run_ranks(args, 1, out, extra_env=env)[0]


@pytest.mark.parametrize("overlap", ["false", "true"])
def test_offload_copies_are_ordered_and_give_the_device_optimizers_losses(overlap, scratch):
    want = losses(scratch, "none", "false", sanitize=False)
    got = losses(scratch, "cpu", overlap, sanitize=True)
    assert got == pytest.approx(want, rel=1e-4)  # CPU Adam against the device's AdamW


def test_parameter_shards_from_nvme_are_ordered_and_give_the_device_optimizers_losses(scratch):
    """Each shard read from NVMe goes up to its gather on a copy stream the compute stream
    waits for; its staging buffer is read into again only once that copy has ended."""
    nvme = scratch / "nvme"
    nvme.mkdir()
    want = losses(scratch, "none", "false", sanitize=False)
    got = losses(scratch, "cpu", "false", sanitize=True, params_nvme=str(nvme))
    assert got == pytest.approx(want, rel=1e-4)
