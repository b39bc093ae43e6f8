"""On a GPU (skipped where none is visible, as on CI; ./zs gpu-check runs each group as a
stage of its own, tools/gpu/stages.py): the paths built and tested on CPU ranks, run with
their model and batches on CUDA (ZS_TEST_DEVICE=cuda, tests/python/devices.py) and held to
the references and tolerances of their CPU tests, the references computed on the GPU too.
One GPU gives one rank over NCCL; a case that needs several ranks has them share the GPU
over Gloo (ZS_DIST_BACKEND=gloo), whose collectives copy CUDA tensors through the host and
whose sends and receives zeroshard's pipeline stages pass through the host themselves
(_parallel/pipelining.py). The front-end cases leave the model where the script built it,
on the host: initialize places it on the GPU, as DeepSpeed's engine does.
ZS_GPU_REHEARSE=1 runs the same cases on the CPU: the plumbing checked where no GPU is."""
import json
import os

import pytest
import torch

from conftest import HERE, run_ranks

REHEARSE = os.environ.get("ZS_GPU_REHEARSE") == "1"
ON = "cpu" if REHEARSE else "cuda"
pytestmark = pytest.mark.skipif(not REHEARSE and not torch.cuda.is_available(),
                                reason="no GPU visible (torch.cuda.is_available() is False)")
ONE_RANK = {"ZS_TEST_DEVICE": ON}  # its own GPU, NCCL's
SHARING = {"ZS_TEST_DEVICE": ON, "ZS_DIST_BACKEND": "gloo"}  # several ranks on one GPU
_references = {}


def once(key, make):
    """A reference run once per session (not shared with the CPU tests' caches)."""
    if key not in _references:
        _references[key] = make()
    return _references[key]


def close(got, want, rel=1e-5, what=""):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= rel * abs(b), f"{what} {i}: {a} vs {b}"


# --- tensor parallelism: TP2 x DP2 over an mpu and over a DTensor plan, 4 ranks sharing
@pytest.mark.parametrize("mode", ["zs", "dtensor"])
def test_tensor_parallel_ranks_on_the_gpu_train_as_the_unsplit_model(mode, scratch):
    import test_tensor_parallel as tp

    def reference():
        out = str(scratch / "tp-ref")
        return run_ranks([tp.WORKER, "ref", "1", str(tp.STEPS), out], 1, out,
                         extra_env=ONE_RANK)[0]
    out = str(scratch / f"tp-{mode}")
    got = run_ranks([tp.WORKER, mode, str(tp.TP), str(tp.STEPS), out, json.dumps(tp.config(3))],
                    tp.WORLD, out, extra_env=SHARING)
    tp.assert_as_unsplit(got, once("tp", reference))


# --- pipeline parallelism: PP2 x DP2, stage to stage through the host over Gloo
@pytest.mark.parametrize("schedule,zero", [("1f1b", {"stage": 1}), ("zerobubble", {"stage": 3})])
def test_pipeline_stages_on_the_gpu_train_as_the_whole_model(schedule, zero, scratch):
    import test_pipeline_parallel as pp

    def reference():
        out = str(scratch / "pp-ref")
        return run_ranks([pp.WORKER, "ref", str(pp.STEPS), out], 1, out, extra_env=ONE_RANK)[0]
    out = str(scratch / f"pp-{schedule}")
    got = run_ranks([pp.WORKER, schedule, str(pp.STEPS), out,
                     json.dumps({"zero_optimization": zero}), "1"], pp.WORLD, out,
                    extra_env=SHARING)
    pp.assert_as_one_process(got, once("pp", reference))
    halves = sum(r["input_halves"] for r in got)  # the split backward ran on the GPU
    assert halves == (3 * 2 * pp.STEPS * 8 if schedule == "zerobubble" else 0), halves


# --- serving: weights at rest on the GPU, in host RAM, on NVMe, a folder's from NVMe
@pytest.mark.parametrize("dtype,tier,source", [
    ("float32", "device", "module"), ("float32", "cpu", "module"),
    ("bfloat16", "nvme", "module"), ("bfloat16", "nvme", "folder")])
def test_inference_from_each_tier_into_the_gpu_generates_the_plain_models_tokens(
        dtype, tier, source, scratch):
    import test_inference
    import hf_worker
    spec = {"dtype": dtype, "tier": tier, "nvme_path": str(scratch / "nvme")}
    os.makedirs(spec["nvme_path"])
    if source == "folder":  # built on the meta device, its placeholders made on the GPU
        folder = scratch / "saved"
        hf_worker.make("llama").to(getattr(torch, dtype)).save_pretrained(
            folder, max_shard_size="40KB")
        spec["folder"] = str(folder)
    out = str(scratch / f"serve-{tier}-{source}")
    (r,) = run_ranks([test_inference.WORKER, out, json.dumps(spec)], 1, out,
                     extra_env=ONE_RANK)
    assert r["tokens_equal"] and r["new_tokens"] == 8, r
    assert r["logits_diff"] == 0.0, r
    held = {"device": "device", "cpu": "host", "nvme": "nvme"}[tier]
    element = 4 if dtype == "float32" else 2
    assert r["rest"][held] >= test_inference.PARAMS * element, r
    assert all(v == 0 for t, v in r["rest"].items() if t != held), r


# --- the front-ends on one GPU, the model left on the host by the script
def test_front_end_trainer_places_the_model_and_logs_the_plain_trainers_losses(scratch):
    import test_trainer
    want, _ = once("trainer", lambda: test_trainer.trainer_run(
        "ddp", scratch, tag="trainer-ref", env=ONE_RANK, world=1))
    got, _ = test_trainer.trainer_run("zs", scratch, {"zero_optimization": {"stage": 3}},
                                      tag="trainer-zs", env=ONE_RANK, world=1)
    close([loss for loss, _ in got[0]], [loss for loss, _ in want[0]], what="loss")
    close([norm for _, norm in got[0]], [norm for _, norm in want[0]], what="norm")


def test_front_end_accelerate_places_the_model_and_trains_as_accelerate(scratch):
    import test_accelerate

    def run(mode, config=None):
        out = str(scratch / f"accelerate-{mode}")
        args = [test_accelerate.WORKER, mode, str(test_accelerate.STEPS), out]
        return run_ranks(args + ([json.dumps(config)] if config else []), 1, out,
                         timeout=600, extra_env=ONE_RANK)[0]
    want = once("accelerate", lambda: run("accelerate"))
    got = run("zs", {"zero_optimization": {"stage": 3}, "gradient_clipping": 1.0})
    close(got["losses"], want["losses"], what="micro-batch")
    for name, value in want["params"].items():
        diff = (torch.tensor(got["params"][name]) - torch.tensor(value)).abs().max().item()
        assert diff <= 1e-5, f"{name}: {diff}"


@pytest.mark.parametrize("strategy", ["zeroshard_stage_2", "zeroshard_stage_3_offload"])
def test_front_end_lightning_places_the_model_and_trains_as_under_ddp(strategy, scratch):
    import test_lightning

    def run(spec):
        out = str(scratch / f"lightning-{spec['strategy']}")
        return run_ranks([test_lightning.TRAINER, out, json.dumps(spec)], 1, out, timeout=600,
                         extra_env=dict(test_lightning.ELASTIC, **ONE_RANK))[0]
    want = once("lightning", lambda: run({"strategy": "ddp", "epochs": 2}))
    got = run({"strategy": strategy, "epochs": 2})
    close(got["losses"], want["losses"], what="micro-batch")
    close(got["norms"], want["norms"], what="step's norm")
    for name, value in want["params"].items():
        diff = (torch.tensor(got["params"][name]) - torch.tensor(value)).abs().max().item()
        assert diff <= 1e-5, f"{name}: {diff}"


def test_front_end_initialize_places_a_host_built_model_on_the_gpu(scratch):
    """A script that builds its model on the host and gives it to initialize, as DeepSpeed
    scripts do: the engine trains on cuda:LOCAL_RANK, as the model the script moved there
    itself (the same kernels: within 1e-6)."""
    if REHEARSE:
        pytest.skip("placement moves a model to a GPU only")
    worker = os.path.join(HERE, "gpu_stream_worker.py")
    runs = {}
    for built_on in ("cpu", "cuda"):
        out = str(scratch / f"placed-{built_on}")
        runs[built_on] = run_ranks([worker, built_on, "none", "false", out], 1, out)[0]
    assert runs["cpu"]["device"] == "cuda:0", runs["cpu"]
    assert runs["cpu"]["losses"] == pytest.approx(runs["cuda"]["losses"], rel=1e-6)


# --- experts: AutoEP's exchanges over 4 ranks sharing the GPU; a rank's grouped GEMM
def test_experts_split_over_ranks_on_the_gpu_train_as_one_process(scratch):
    script = os.path.join(HERE, "moe_ep_script.py")
    out = str(scratch / "experts")
    ranks = run_ranks([script, out, "mixtral", "2"], 4, out, extra_env=SHARING)
    for rank, got in enumerate(ranks):
        assert got["losses"] == pytest.approx(got["want_losses"], abs=1e-5), rank
        assert got["norms"] == pytest.approx(got["want_norms"], rel=1e-5), rank
        assert got["param_diff"] < 1e-5, rank
        assert got["whole_diff"]["state_dict"] < 1e-5, rank


def test_experts_of_a_rank_run_in_cudas_grouped_gemm_in_bfloat16():
    """On CUDA torch's grouped GEMM takes bfloat16 at compute capability 8.0 and above:
    6 of them (2 forward, 4 backward) give the loop's outputs and gradients; float32 takes
    the loop."""
    if REHEARSE:
        pytest.skip("CUDA's grouped GEMM only")
    from test_expert_parallel import local_experts
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("grouped GEMM in bfloat16 needs compute capability 8.0")
    calls, grouped = local_experts(32, torch.bfloat16, 20, "grouped_mm", "cuda")
    assert calls == 6
    loop_calls, loop = local_experts(32, torch.bfloat16, 20, "eager", "cuda")
    assert loop_calls == 0
    for got, want in zip(grouped, loop):
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2)
    assert local_experts(32, torch.float32, 20, "grouped_mm", "cuda")[0] == 0


# --- sequence parallelism: Ulysses' all-to-alls over 2 ranks sharing the GPU
@pytest.mark.parametrize("stage", [2, 3])
def test_sequence_parallel_ranks_on_the_gpu_train_as_whole_sequences(stage, scratch):
    worker = os.path.join(HERE, "sequence_worker.py")
    out = scratch / f"sp-{stage}"
    ranks = run_ranks([worker, str(out), f"sp-{stage}", "zeroshard"], 2, out, extra_env=SHARING)
    for rank in ranks:
        assert rank["max_param_diff"] < 1e-5, rank["max_param_diff"]
    whole = [ranks[0]["losses"][i] + ranks[1]["losses"][i] for i in range(4)]
    for step, want in enumerate(ranks[0]["ref_losses"]):
        assert abs((whole[2 * step] + whole[2 * step + 1]) / 2 - want) < 1e-5, step


# --- activation offload: the blocks' saved tensors to host RAM and NVMe and back
def test_activation_offload_on_the_gpu_is_training_without(scratch):
    from test_activation_offload import assert_offloaded_training_is_training_without
    assert_offloaded_training_is_training_without(scratch, SHARING)
