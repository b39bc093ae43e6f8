"""The device a test rank computes on: ZS_TEST_DEVICE=cuda (tests/python/test_gpu_paths.py)
puts each rank on GPU LOCAL_RANK % the GPUs it sees, so several ranks share one GPU where
the machine has fewer (their collectives then go over Gloo: ZS_DIST_BACKEND=gloo); unset,
the CPU, and the workers run as they always did."""
import os

import torch


def device():
    kind = os.environ.get("ZS_TEST_DEVICE", "cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise ValueError(f"ZS_TEST_DEVICE={kind!r}; allowed: cpu, cuda")
    where = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(where)
    return where


def on_host(tensors):
    """A dict of tensors on the host, for torch.save and for comparisons with tensors read back."""
    return {k: v.detach().cpu() for k, v in tensors.items()}
