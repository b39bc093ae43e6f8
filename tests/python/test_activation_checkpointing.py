"""zeroshard.checkpointing (deepspeed.checkpointing's API) and the activation_checkpointing
keys: every way of keeping a checkpoint gives the gradients of the model run without
checkpointing, bit for bit (dropout's masks drawn again from the restored RNG states,
the model-parallel tracker's included), and holds the bytes it should: whole inputs,
or 1/tp of each with partition_activations. Errors name the key and what is allowed."""
import os

import pytest
import torch

from conftest import HERE, main_leg_only, run_ranks

WORKER = os.path.join(HERE, "checkpointing_worker.py")
WORLD, BLOCKS, WIDTH, BATCH = 2, 4, 16, 6
INPUT_BYTES = BATCH * WIDTH * 4  # one block's fp32 input


def run(scratch, mode):
    return run_ranks([WORKER, str(scratch / mode), mode], WORLD, scratch / mode)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run(tmp_path_factory.mktemp("plain"), "plain")


@pytest.mark.parametrize("mode, held", [
    ("whole", BLOCKS * INPUT_BYTES),
    ("cpu", BLOCKS * INPUT_BYTES),
    ("partition", BLOCKS * INPUT_BYTES // WORLD),
    ("partition_cpu", BLOCKS * INPUT_BYTES // WORLD),
    ("contiguous", BLOCKS * INPUT_BYTES // WORLD),
])
def test_each_way_of_keeping_checkpoints_gives_the_plain_gradients(plain, scratch, mode, held):
    got = run(scratch, mode)
    for rank in range(WORLD):
        want, have = plain[rank], got[rank]
        assert have["losses"] == want["losses"], (rank, have["losses"], want["losses"])
        assert have["grads"] == want["grads"], rank
        assert have["input_grad"] == want["input_grad"], rank
        assert have["held"] == held, (rank, have["held"], held)
        assert have["after_backward"] == 0, have["after_backward"]
    # The tracker's state differs across the group: so do its dropout masks.
    assert got[0]["grads"] != got[1]["grads"]


@main_leg_only
def test_initialize_configures_checkpointing_from_the_configs_keys(scratch):
    got, want = run(scratch, "config"), run(scratch, "plain_alone")  # neither names an mpu
    for rank in range(WORLD):
        # Applied, while is_configured() stays False: Megatron keeps its own RNG tracker
        # unless it configured this one itself, as under DeepSpeed.
        assert got[rank]["configured"] is False
        assert got[rank]["losses"] == want[rank]["losses"], rank
        assert got[rank]["input_grad"] == want[rank]["input_grad"], rank
        # partition_activations over a group of one: whole slices, in host RAM
        assert got[rank]["held"] == BLOCKS * INPUT_BYTES


def in_process(body):
    """A fresh interpreter running `body` (zeroshard.checkpointing's state is per process)."""
    import subprocess
    import sys

    from conftest import BUILD
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    for v in ("RANK", "WORLD_SIZE"):
        env.pop(v, None)
    r = subprocess.run([sys.executable, "-c", "import torch\nfrom zeroshard import checkpointing\n"
                        + body], env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


@main_leg_only
@pytest.mark.parametrize("call, said", [
    ("checkpointing.configure(None, contiguous_checkpointing=True, num_checkpoints=2)",
     "contiguous_memory_optimization lays out partitioned activations; allowed: it with "
     "partition_activations true, or false"),
    ("checkpointing.configure(None, partition_activations=True, contiguous_checkpointing=True)",
     "contiguous_memory_optimization sizes its buffers by number_checkpoints, which is not set"),
    ("checkpointing.configure(None, checkpoint_in_cpu='yes')",
     "configure(checkpoint_in_cpu=...) is 'yes'; allowed: true or false"),
    ("checkpointing.configure(None, deepspeed_config={'activation_checkpointing': "
     "{'cpu_checkpoint': True}})",
     "activation_checkpointing.cpu_checkpoint is no key of DeepSpeed's; allowed: "
     "partition_activations, contiguous_memory_optimization, cpu_checkpointing"),
    ("checkpointing.configure(None, deepspeed_config={'activation_checkpointing': "
     "{'number_checkpoints': 0}})",
     "activation_checkpointing.number_checkpoints is 0; allowed: a count of checkpoints >= 1"),
    ("checkpointing.get_cuda_rng_tracker().fork('dropout').__enter__()",
     "fork('dropout'): no state of that name"),
])
def test_bad_settings_are_refused_by_name(call, said):
    code, out = in_process(call)
    assert code != 0 and said in out, out


@main_leg_only
def test_more_checkpoints_than_the_contiguous_buffers_hold_is_refused():
    code, out = in_process(
        "checkpointing.configure(None, partition_activations=True, contiguous_checkpointing=True,"
        " num_checkpoints=1)\n"
        "x = torch.ones(4, requires_grad=True)\n"
        "y = checkpointing.checkpoint(torch.sin, x)\n"
        "checkpointing.checkpoint(torch.sin, y)\n")
    assert code != 0 and "more checkpoint() calls before a backward than number_checkpoints " \
                         "(1)" in out, out


@main_leg_only
def test_profile_prints_each_forward_and_backward_time():
    code, out = in_process(
        "checkpointing.configure(None, profile=True, synchronize=True)\n"
        "x = torch.ones(4, requires_grad=True)\n"
        "checkpointing.checkpoint(torch.sin, x).sum().backward()\n"
        "assert torch.equal(x.grad, torch.cos(torch.ones(4))), x.grad\n")
    assert code == 0, out
    lines = out.splitlines()
    assert any(line.startswith("time (ms) | fwd: ") for line in lines), out
    assert any(line.startswith("time (ms) | backward: ") for line in lines), out


def test_the_default_checkpoint_is_what_a_pipeline_module_runs():
    from zeroshard._parallel import pipe_module
    from zeroshard.checkpointing import checkpoint
    x = torch.randn(3, 4, requires_grad=True)
    lin = torch.nn.Linear(4, 4)
    y = pipe_module.reentrant_checkpoint(lin, x)
    assert y.grad_fn is not None and "CheckpointFunction" in type(y.grad_fn).__name__
    assert torch.equal(y, checkpoint(lin, x))


@main_leg_only
def test_the_seeds_are_deepspeeds():
    """model_parallel_cuda_manual_seed gives the default generator and the tracker's state
    what DeepSpeed 0.19.8's gives them (tensor-parallel rank 1 of 2 here)."""
    from conftest import free_port
    code, out = in_process(f"""
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}", RANK="0", LOCAL_RANK="0",
                  WORLD_SIZE="1")
import deepspeed
deepspeed.init_distributed("gloo")
from deepspeed.runtime.activation_checkpointing import checkpointing as ds


class Mpu:
    def get_tensor_model_parallel_rank(self): return 1
    def get_tensor_model_parallel_world_size(self): return 2
    def get_tensor_model_parallel_group(self): return None
    def get_data_parallel_rank(self): return 0


draws = []
for module in (ds, checkpointing):
    module.configure(Mpu())
    module.model_parallel_cuda_manual_seed(1234)
    with module.get_cuda_rng_tracker().fork():
        tracked = torch.rand(5)
    draws.append((tracked, torch.rand(5)))
assert torch.equal(draws[0][0], draws[1][0]), draws
assert torch.equal(draws[0][1], draws[1][1]), draws
assert not torch.equal(draws[0][0], draws[0][1])
print("same draws")
""")
    assert code == 0 and "same draws" in out, out


@main_leg_only
def test_inputs_not_kept_as_checkpoints_get_their_gradient_once():
    """A tensor input checkpoint() does not keep (marked no_checkpointing, or too small to
    split) starts the recompute cut from its graph: a leaf's gradient is not counted twice,
    and the graph that made a non-leaf is still there for the backward that follows."""
    code, out = in_process(
        "x = torch.linspace(-1, 1, 4, requires_grad=True)\n"
        "x.no_checkpointing = True\n"
        "checkpointing.checkpoint(lambda t: (t * t).sum(), x).backward()\n"
        "assert torch.equal(x.grad, 2 * x.detach()), x.grad\n"
        "x.grad = None\n"
        "y = x * 2\n"
        "y.no_checkpointing = True\n"
        "z = checkpointing.checkpoint(torch.sin, y)\n"
        "(z.sum() + y.sum()).backward()\n"
        "assert torch.allclose(x.grad, 2 * torch.cos(2 * x.detach()) + 2), x.grad\n"
        "print('once')\n")
    assert code == 0 and "once" in out, out


@main_leg_only
def test_deepspeeds_non_reentrant_checkpoint_is_refused_by_name():
    import zeroshard
    from zeroshard import checkpointing
    from zeroshard.runtime.activation_checkpointing import checkpointing as deep
    for module in (checkpointing, deep):
        with pytest.raises(zeroshard.Error, match=r"non_reentrant_checkpoint .*instead: "
                                                  r"zeroshard\.checkpointing\.checkpoint"):
            module.non_reentrant_checkpoint
        with pytest.raises(AttributeError):
            module.no_such_name
