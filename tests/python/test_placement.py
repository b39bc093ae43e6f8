"""Where initialize puts a model the script built on the host (_parallel/placement.py): on
the CUDA accelerator this rank's GPU, cuda:LOCAL_RANK, as DeepSpeed's engine moves it; on
the CPU accelerator (DS_ACCELERATOR=cpu, or no GPU) the host; a front-end's own device
(`placement.chosen`) before either. The move itself needs a GPU:
tests/python/test_gpu_paths.py runs it there. And torch.distributed started by
zeroshard.init_distributed follows ZS_DIST_BACKEND, as the engine's own groups do, and on a
GPU starts NCCL beside Gloo."""
import pytest
import torch

from conftest import main_leg_only, run_snippet

pytestmark = main_leg_only


def test_the_target_is_this_ranks_gpu_on_the_cuda_accelerator_and_none_on_the_cpu():
    import zeroshard
    from zeroshard._parallel import placement
    assert placement.target_device("cpu", 3, 0) is None
    assert placement.target_device("cuda", 1, 2) == torch.device("cuda", 1)
    with pytest.raises(zeroshard.Error, match=r"LOCAL_RANK is 2 and this process sees 1 GPU\(s\), "
                                              r"so the model built on the host has no cuda:2 .*"
                                              r"allowed: LOCAL_RANK below 1 \(one rank per GPU\)"):
        placement.target_device("cuda", 2, 1)


def test_a_host_model_stays_on_the_host_on_the_cpu_accelerator_or_a_front_ends_cpu(monkeypatch):
    from zeroshard._parallel import placement
    model = torch.nn.Linear(4, 4)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert placement.place(model) is None
    with placement.chosen("cpu"):
        assert placement.place(model) is None
    assert next(model.parameters()).device.type == "cpu"


def test_init_distributed_follows_zs_dist_backend():
    status, out = run_snippet(
        "import os\nos.environ['ZS_DIST_BACKEND'] = 'gloo'\nzeroshard.init_distributed()\n"
        "print('backend', torch.distributed.get_backend())")
    assert status == 0 and "backend gloo" in out, out
    status, out = run_snippet(
        "import os\nos.environ['ZS_DIST_BACKEND'] = 'mpi'\nzeroshard.init_distributed()")
    assert status != 0 and "zeroshard.init_distributed: ZS_DIST_BACKEND='mpi'; allowed: " \
        "'nccl' (GPUs), 'gloo' (CPU)" in out, out


def test_torch_distributed_starts_nccl_beside_gloo_on_the_cuda_accelerator(monkeypatch):
    """NCCL's for CUDA tensors (as DeepSpeed's initialize starts it on a GPU), Gloo's beside
    it for the package's host collectives; Gloo alone on the CPU or for ranks sharing one
    GPU (ZS_DIST_BACKEND=gloo)."""
    from zeroshard._common import launch
    monkeypatch.delenv("ZS_DIST_BACKEND", raising=False)
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    assert launch.process_group_backend() == "cpu:gloo,cuda:nccl"
    assert launch.process_group_backend("nccl") == "cpu:gloo,cuda:nccl"
    monkeypatch.setenv("ZS_DIST_BACKEND", "gloo")
    assert launch.process_group_backend() == "gloo"
    monkeypatch.delenv("ZS_DIST_BACKEND")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert launch.process_group_backend() == "gloo"
