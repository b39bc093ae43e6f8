"""A DeepSpeed script switches by its imports: tests/python/deepspeed_script.py runs on 2
real ranks with DeepSpeed (its CPU accelerator, Gloo), and again with its three import
lines pointed at zeroshard; the losses, gradient norms, accessors, checkpoint resume and
exported parameters agree. DeepSpeed's names that zeroshard carries keep its signatures."""
import inspect
import json
import os
import re
import subprocess
import sys
import time

import pytest

import deepspeed_layout
from conftest import (BUILD, HERE, OLDEST_LEG, main_leg_only, run_ranks, run_snippet,
                      switched_to_zeroshard)

SCRIPT = os.path.join(HERE, "deepspeed_script.py")
# DeepSpeed is pinned on the main leg; the oldest-torch leg has none (its torch is
# Debian's), so the comparisons with DeepSpeed run on the main leg only.
WITH_DEEPSPEED = pytest.mark.skipif(OLDEST_LEG, reason="DeepSpeed is installed on the main "
                                    "leg only")
ZERO = {1: {"stage": 1}, 2: {"stage": 2}, 3: {"stage": 3},
        "2-cpu": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        # torch.optim.SGD named in the config, as DeepSpeed takes any torch.optim class
        "3-sgd": {"stage": 3}}
SGD = {"optimizer": {"type": "SGD", "params": {"lr": 5e-2, "momentum": 0.9,
                                               "weight_decay": 0.01}},
       "zero_allow_untested_optimizer": True}


def write_config(scratch, zero, name, optimizer=None):
    config = scratch / f"{name}.json"
    config.write_text(json.dumps(dict({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "steps_per_print": 1000,
        "zero_optimization": dict(zero, stage3_gather_16bit_weights_on_model_save=True),
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01,
                                                  "torch_adam": True}},
        # A config scheduler: its position comes back with DeepSpeed's checkpoint too.
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4,
                                                     "warmup_type": "linear"}}},
        **(optimizer or {}))))
    return config


def script_args(scratch, script, zero, name, optimizer=None):
    config = write_config(scratch, zero, name, optimizer)
    return [script, "--deepspeed", "--deepspeed_config", str(config),
            "--out", str(scratch / name), "--checkpoint", str(scratch / f"{name}-ckpt")]


def run(scratch, script, zero, name, extra=(), optimizer=None):
    return run_ranks(script_args(scratch, script, zero, name, optimizer) + list(extra), 2,
                     str(scratch / name),
                     extra_env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})


def switched_script(scratch):
    return switched_to_zeroshard(SCRIPT, scratch)


@WITH_DEEPSPEED
@pytest.mark.parametrize("zero", list(ZERO), ids=str)
def test_the_script_with_its_imports_switched_gives_deepspeeds_numbers(zero, scratch):
    optimizer = SGD if zero == "3-sgd" else None
    theirs = run(scratch, SCRIPT, ZERO[zero], "ds", optimizer=optimizer)
    # zeroshard resumes from the checkpoint DeepSpeed saved (converted as it loads: its
    # Adam moments, or SGD's momentum buffers)
    ours = run(scratch, switched_script(scratch), ZERO[zero], "zs",
               ["--resume_from", str(scratch / "ds-ckpt")], optimizer=optimizer)
    for rank, (got, want) in enumerate(zip(ours, theirs)):
        for key in ("stage", "fp16", "bf16", "local_rank", "global_rank", "world_size",
                    "train_batch_size", "micro_batch", "accumulation", "device", "rank",
                    "local", "ranks", "accelerator", "boundaries", "applied", "resumed_step",
                    "saved", "global_steps", "global_samples", "dp_world_size", "mp_world_size",
                    "gradient_clipping", "steps_loaded", "lrs", "resumed_lrs"):
            assert got[key] == want[key], (rank, key)
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-5)
        assert got["resumed"] == pytest.approx(want["resumed"], abs=1e-5)
        assert got["export"] == pytest.approx(want["export"], abs=1e-5)
        assert got["saved_sums"] == pytest.approx(want["saved_sums"], abs=1e-5)
        assert sorted(got["saved_sums"]) == sorted(got["export"])
    assert ours[0]["train_batch_size"] == 16 and ours[0]["boundaries"][:2] == [False, True]
    # The same checkpoint at another world size: one rank holds every parameter's master
    # as DeepSpeed's own zero_to_fp32 reads it from the 2 ranks' files.
    code, out = run_snippet(
        f"import sys; sys.path.insert(0, {HERE!r})\n"
        "from deepspeed_script import Net\n"
        "from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint\n"
        f"ckpt = {str(scratch / 'ds-ckpt')!r}\n"
        "want = get_fp32_state_dict_from_zero_checkpoint(ckpt)\n"
        "torch.manual_seed(1)\n"
        "engine = zeroshard.initialize(model=Net(), config="
        f"{str(write_config(scratch, ZERO[zero], 'one', optimizer))!r})[0]\n"
        "engine.load_checkpoint(ckpt)\n"
        "got = engine.state_dict()\n"
        "assert sorted(got) == sorted(want), (sorted(got), sorted(want))\n"
        "print('DIFF', max((got[k] - want[k]).abs().max().item() for k in want))\n")
    assert code == 0, out
    assert float(out.split("DIFF ", 1)[1].split()[0]) == 0.0, out


def _undecorated(fn):
    """deepspeed.comm's collectives under its timing decorator (which keeps no
    __wrapped__): the function the decorator closed over."""
    for cell in getattr(fn, "__closure__", None) or ():
        if inspect.isfunction(cell.cell_contents):
            return cell.cell_contents
    return fn


@WITH_DEEPSPEED
@pytest.mark.parametrize("zero", [2, 3])
def test_a_load_without_the_optimizers_state_gives_deepspeeds_numbers(zero, scratch):
    """load_checkpoint(load_optimizer_states=False) halfway back, on the engine that
    trained: under both, the weights and the step count are the checkpoint's and Adam
    keeps the moments and step count it has, so the losses after it agree."""
    theirs = run(scratch, SCRIPT, ZERO[zero], "ds", ["--load_weights_only"])
    ours = run(scratch, switched_script(scratch), ZERO[zero], "zs",
               ["--resume_from", str(scratch / "ds-ckpt"), "--load_weights_only"])
    full = run(scratch, switched_script(scratch), ZERO[zero], "full",
               ["--resume_from", str(scratch / "ds-ckpt")])
    for got, want, whole in zip(ours, theirs, full):
        assert got["steps_loaded"] == want["steps_loaded"] == 3  # saved halfway through 6
        assert got["resumed"] == pytest.approx(want["resumed"], abs=1e-5)
        assert got["export"] == pytest.approx(want["export"], abs=1e-5)
        assert got["resumed"] != pytest.approx(whole["resumed"], abs=1e-3)  # the moments mattered


@WITH_DEEPSPEED
def test_deepspeeds_names_keep_their_signatures():
    import deepspeed
    import deepspeed.comm
    import zeroshard
    import zeroshard.comm
    from deepspeed.accelerator import get_accelerator as ds_accelerator
    from deepspeed.runtime.engine import DeepSpeedEngine
    from zeroshard._engine.engine import ZeroShardEngine
    from zeroshard.accelerator import get_accelerator
    pairs = [(getattr(ZeroShardEngine, name), getattr(DeepSpeedEngine, name))
             for name in ("backward", "step", "save_checkpoint", "load_checkpoint",
                          "save_16bit_model", "zero_grad", "train", "eval")]
    pairs += [(zeroshard.init_distributed, deepspeed.init_distributed),
             (zeroshard.add_config_arguments, deepspeed.add_config_arguments),
             (zeroshard.zero.GatheredParameters, deepspeed.zero.GatheredParameters),
             (zeroshard.zero.register_external_parameter,
              deepspeed.zero.register_external_parameter)]
    for name in ("init_distributed", "barrier", "broadcast", "all_reduce", "reduce",
                 "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "gather",
                 "scatter", "all_to_all_single", "send", "recv", "isend", "irecv",
                 "broadcast_object_list", "all_gather_object", "monitored_barrier",
                 "get_rank", "get_world_size", "get_local_rank", "get_global_rank",
                 "new_group", "is_initialized", "is_available", "destroy_process_group"):
        pairs.append((getattr(zeroshard.comm, name), getattr(deepspeed.comm, name)))
    ours_acc, theirs_acc = get_accelerator(), ds_accelerator()
    for name in ("device_name", "device", "set_device", "current_device",
                 "current_device_name", "device_count", "synchronize", "is_available",
                 "communication_backend_name", "is_bf16_supported", "is_fp16_supported",
                 "manual_seed", "manual_seed_all", "get_rng_state", "set_rng_state",
                 "empty_cache", "memory_allocated", "max_memory_allocated",
                 "reset_peak_memory_stats", "memory_reserved", "total_memory",
                 "available_memory", "on_accelerator"):  # (pin_memory differs between its own)
        pairs.append((getattr(ours_acc, name), getattr(theirs_acc, name)))
    differ = []
    for ours, theirs in pairs:
        a = list(inspect.signature(ours).parameters)
        b = list(inspect.signature(_undecorated(theirs)).parameters)
        if a != b:
            differ.append(f"{ours.__qualname__}: {a} vs DeepSpeed's {b}")
    assert differ == []


@main_leg_only
def test_what_has_no_meaning_here_is_refused_by_name():
    import zeroshard
    import zeroshard.comm
    with pytest.raises(AttributeError, match="zeroshard.comm has no 'log_summary'"):
        zeroshard.comm.log_summary
    with pytest.raises(zeroshard.Error, match="prof=True.*communication logger"):
        zeroshard.comm.barrier(prof=True)
    with pytest.raises(zeroshard.Error, match="fwd_module=None"):
        with zeroshard.zero.GatheredParameters([], fwd_module=object()):
            pass


def launch(args, timeout=300):
    """`python -m zeroshard ARGS` (the `zeroshard` command) with the built package."""
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), OMP_NUM_THREADS="1",
               USE_LIBUV="0")
    env.pop("MASTER_PORT", None)
    return subprocess.run([sys.executable, "-m", "zeroshard"] + args, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def test_the_zeroshard_launcher_starts_the_ranks_as_deepspeeds_does(scratch):
    """DeepSpeed's launcher flags and its --local_rank argument; the same numbers as the
    ranks started another way; each rank's lines shown with its rank."""
    script = switched_script(scratch)
    want = run(scratch, script, ZERO[1], "plain")
    done = launch(["--num_gpus", "2"] + script_args(scratch, script, ZERO[1], "launched"))
    assert done.returncode == 0, done.stdout[-3000:]
    assert "[rank0]: " in done.stdout and "[rank1]: " in done.stdout
    for rank in range(2):
        with open(f"{scratch / 'launched'}.rank{rank}.json") as f:
            got = json.load(f)
        assert got["given_local_rank"] == rank  # --local_rank=N, as DeepSpeed passes it
        assert got["losses"] == want[rank]["losses"]
        assert got["world_size"] == 2 and got["global_rank"] == rank


def test_a_failing_rank_stops_the_others_and_is_the_exit_status(scratch):
    script = scratch / "fails.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1': sys.exit(3)\n"
                      "time.sleep(120)\n")
    start = time.monotonic()
    done = launch(["--num_gpus", "2", "--no_local_rank", str(script)])
    assert done.returncode == 3
    assert "rank 1 exited with status 3; stopping the other 1 rank(s)" in done.stdout
    assert time.monotonic() - start < 60


@main_leg_only
def test_launcher_flags_without_meaning_here_are_refused_by_name(scratch):
    done = launch(["--num_nodes", "2", "x.py"])
    assert done.returncode == 2 and "--num_nodes 2: name the hosts in a --hostfile" in done.stdout
    done = launch(["--include", "worker-1:0", "x.py"])
    assert done.returncode == 2 and "only this host's slots" in done.stdout
    hostfile = scratch / "hostfile"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    done = launch(["--hostfile", str(hostfile), "--include", "worker-2", "x.py"])
    assert done.returncode == 2 and ("--include 'worker-2': host 'worker-2' is not in the "
                                     "hostfile; allowed: worker-0, worker-1") in done.stdout
    done = launch(["--hostfile", str(hostfile), "--launcher", "slurm", "x.py"])
    assert done.returncode == 2 and "--launcher slurm: start the ranks with that launcher" \
        in done.stdout
    hostfile.write_text("worker-0 gpus=2\n")
    done = launch(["--hostfile", str(hostfile), "x.py"])
    assert done.returncode == 2 and ("line 1: 'worker-0 gpus=2'; allowed: 'HOSTNAME slots=N'"
                                     in done.stdout)


def test_a_hostfile_and_deepspeeds_resource_flags_choose_hosts_and_slots():
    """DeepSpeed's NODE_SPEC syntax for --include/--exclude, then --num_nodes and
    --num_gpus, over a hostfile's hosts in its order (bindings/zeroshard/_tools/hostfile.py)."""
    from zeroshard._tools.hostfile import HostfileError, resources
    hosts = {"a": 4, "b": 4, "c": 2}
    assert resources(hosts) == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1]}
    assert resources(hosts, include="c@a:1,3") == {"a": [1, 3], "c": [0, 1]}
    assert resources(hosts, exclude="b@a:0") == {"a": [1, 2, 3], "c": [0, 1]}
    assert resources(hosts, num_nodes=2, num_gpus=2) == {"a": [0, 1], "b": [0, 1]}
    for kwargs, said in (({"num_gpus": 3}, "--num_gpus 3: c has fewer slots"),
                         ({"include": "a:7"}, "--include 'a:7': a has slots 0..3, not [7]"),
                         ({"num_nodes": 4}, "--num_nodes 4: the hostfile leaves 3 host(s)"),
                         ({"exclude": "a@b@c"}, "no host is left to run on")):
        with pytest.raises(HostfileError, match=re.escape(said)):
            resources(hosts, **kwargs)


@WITH_DEEPSPEED
def test_a_deepspeed_fp16_loss_scale_resumes_where_deepspeed_left_it(scratch):
    """A DeepSpeed stage-2 checkpoint in its own layout (one rank), its optimizer states
    holding DeepSpeed's DynamicLossScaler after an overflow history: the engine loads it in
    fp16 and its scale then moves step for step as DeepSpeed's own scaler does."""
    import torch
    import deepspeed.runtime.fp16.loss_scaler as ds_scaler
    ds_scaler.dist.get_rank = lambda: 0  # (its log line asks for a rank)
    scaler = ds_scaler.DynamicLossScaler(init_scale=2 ** 8, scale_window=2, min_scale=1,
                                         delayed_shift=2, consecutive_hysteresis=False)
    for overflow in (False, True, True, False):
        scaler.update_scale(overflow)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    folder = scratch / "ds" / "global_step3"
    folder.mkdir(parents=True)
    (scratch / "ds" / "latest").write_text("global_step3")
    torch.save({"optimizer_state_dict": {
        "zero_stage": 2, "loss_scaler": scaler, "dynamic_loss_scale": True,
        "single_partition_of_fp32_groups": [flat.clone()],
        "base_optimizer_state": {"state": {0: {"step": 3, "exp_avg": torch.zeros(10),
                                               "exp_avg_sq": torch.zeros(10)}},
                                 "param_groups": [{"lr": 1e-3}]}}},
        folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    torch.save({"module": model.state_dict(), "buffer_names": [],
                "param_shapes": [{"weight": torch.Size([2, 4]), "bias": torch.Size([2])}],
                "global_steps": 3, "ds_config": {}},
               folder / "mp_rank_00_model_states.pt")
    code, out = run_snippet(
        "import json\n"
        "m = torch.nn.Linear(4, 2)\n"
        "cfg = {'train_micro_batch_size_per_gpu': 1, 'zero_optimization': {'stage': 2},\n"
        "       'fp16': {'enabled': True, 'loss_scale_window': 2, 'hysteresis': 2},\n"
        "       'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}}}\n"
        "e = zeroshard.initialize(model=m, config=cfg)[0]\n"
        f"e.load_checkpoint({str(scratch / 'ds')!r})\n"
        "scales = [e.loss_scale]\n"
        "for _ in range(5):\n"
        "    e.backward(e(torch.ones(1, 4, dtype=torch.half)).float().sum()); e.step()\n"
        "    scales.append(e.loss_scale)\n"
        "print('SCALES', json.dumps(scales))\n")
    assert code == 0, out
    scales = json.loads(out.split("SCALES ", 1)[1].splitlines()[0])
    expected = [scaler.cur_scale]
    for _ in range(5):
        scaler.update_scale(False)
        expected.append(scaler.cur_scale)
    assert scales == expected, (scales, expected)
    assert len(set(expected)) > 1  # the scale grew inside the steps compared


def test_a_deepspeed_checkpoint_converts_one_rank_file_at_a_time(scratch):
    """Two parameter groups, a frozen bf16 parameter and a buffer, at stage 3 on 2 ranks:
    the converted checkpoint holds every master, moment, frozen value and buffer where its
    manifest says, and converting holds about one rank's file in memory at a time (the
    rank files are 2 x 50 MB: it grows by less than 1.5 of one; the whole state, 100 MB, is
    never held)."""
    import torch
    torch.manual_seed(0)
    params = [{"big": torch.randn(4096, 2048), "bias": torch.randn(3)},
              {"norm": torch.randn(5)}]
    frozen = {"embed": torch.randn(7, 3).to(torch.bfloat16)}
    buffers = {"bn.running_mean": torch.randn(4)}
    ds = scratch / "ds"
    deepspeed_layout.stage3(ds / "global_step2", 2, params, frozen, buffers)
    rank_file = os.path.getsize(ds / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    out = scratch / "converted"
    # VmHWM (this process's peak resident set; ru_maxrss would carry pytest's over exec)
    code, said = run_snippet(
        "def status(key):\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith(key + ':'))\n"
        "    return int(line.split()[1]) * 1024\n"
        "before = status('VmRSS')\n"
        f"zeroshard.convert_deepspeed_checkpoint({str(ds)!r}, {str(out)!r})\n"
        "print('GREW', status('VmHWM') - before)\n")
    assert code == 0, said
    grew = int(said.split("GREW ", 1)[1].split()[0])
    assert grew < 1.5 * rank_file, f"converting grew by {grew} bytes; a rank file is {rank_file}"
    manifest = json.loads((out / "global_step2" / "manifest.json").read_text())
    raw = (out / "global_step2" / "rank0.bin").read_bytes()
    assert manifest["optimizer_state"] == ["exp_avg", "exp_avg_sq"]
    trained, held = manifest["groups"]
    numel = trained["shard_numel"]
    arrays = torch.frombuffer(bytearray(raw[:3 * 4 * numel]), dtype=torch.float32).view(3, numel)
    want = {n: t for g in params for n, t in g.items()}
    assert [p["name"] for p in trained["params"]] == list(want)
    for p in trained["params"]:
        got = arrays[:, p["offset"]:p["offset"] + p["numel"]]
        w = want[p["name"]].reshape(-1)
        assert torch.equal(got[0], w) and torch.equal(got[1], 2 * w) and torch.equal(got[2], 3 * w)
    (p,) = held["params"]
    assert held["dtype"] == "bf16" and p["name"] == "embed"
    start = held["file_offset"]
    embed = torch.frombuffer(bytearray(raw[start:start + 2 * 21]), dtype=torch.bfloat16)
    assert torch.equal(embed, frozen["embed"].reshape(-1))
    (b,) = manifest["buffers"]
    mean = torch.frombuffer(bytearray(raw[b["offset"]:b["offset"] + b["bytes"]]),
                            dtype=torch.float32)
    assert b["name"] == "bn.running_mean" and torch.equal(mean, buffers["bn.running_mean"])
