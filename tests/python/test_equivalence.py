"""zeroshard from Python against torch DDP (gloo) + AdamW: same model, data and seed,
20 steps, 2 real ranks; every stage and each offload config in configs/ gives the same
loss every step (fp32, within 1e-5 relative)."""
import json
import os

import pytest
import yaml

from conftest import (EQUIVALENCE_STEPS, EQUIVALENCE_WORLD, ROOT, TRAIN_WORKER,
                      assert_same, both_legs, ddp_losses, run_ranks, with_reference_optimizer)

STEPS, WORLD = EQUIVALENCE_STEPS, EQUIVALENCE_WORLD
WORKER = TRAIN_WORKER


def zs_losses(model, config, scratch, tag, extra_env=None):
    out = str(scratch / f"zs-{tag}")
    return run_ranks([WORKER, "zs", model, str(STEPS), out, json.dumps(config)], WORLD, out,
                     extra_env=extra_env)


def test_stage3_with_activation_checkpointing_matches_ddp(scratch):
    """Blocks recomputed in backward (torch.utils.checkpoint, reentrant and not) run
    stage 3's forward hooks again inside backward: the same losses as DDP. Every unit is
    freed after use (persistence 0), so the recompute really gathers."""
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    got = zs_losses("ckpt", with_reference_optimizer({"zero_optimization": zero}, scratch),
                    scratch, "ckpt")
    assert_same(got, ddp_losses("ckpt", scratch))


@pytest.mark.parametrize("stage", [0, 1, both_legs(2), both_legs(3)])
def test_stage_matches_ddp(stage, scratch):
    config = with_reference_optimizer({"zero_optimization": {"stage": stage}}, scratch)
    assert_same(zs_losses("gpt", config, scratch, f"stage{stage}"), ddp_losses("gpt", scratch))


@pytest.mark.parametrize("name", ["zero2_cpu_offload", "zero3_cpu_offload",
                                  both_legs("zero3_nvme")])
def test_offload_config_matches_ddp(name, scratch):
    with open(os.path.join(ROOT, "configs", name + ".yaml")) as f:
        config = with_reference_optimizer(yaml.safe_load(f), scratch / "nvme")
    os.makedirs(scratch / "nvme", exist_ok=True)
    assert_same(zs_losses("gpt", config, scratch, name), ddp_losses("gpt", scratch))
    assert not [d for d in os.listdir(scratch / "nvme") if d.startswith("zeroshard-swap-")]


@pytest.mark.parametrize("stage", [2, both_legs(3)])
def test_hugging_face_style_model_matches_ddp(stage, scratch):
    """Tied embeddings, a frozen module, a module used twice, a branch skipped on some steps."""
    config = with_reference_optimizer({"zero_optimization": {"stage": stage}}, scratch)
    assert_same(zs_losses("hf", config, scratch, f"hf{stage}"), ddp_losses("hf", scratch))


@pytest.mark.parametrize("offload", ["none", both_legs("nvme")])
def test_parameters_written_in_gathered_parameters_are_trained_from(offload, scratch):
    """Rank 0 overwrites a stage-3 unit's weight and a whole parameter inside
    gathered_parameters(modifier_rank=0); training then matches DDP started from the
    same values (the shards and the fp32 master took them, on NVMe too)."""
    zero = {"stage": 3}
    if offload == "nvme":
        zero["offload_optimizer"] = {"device": "nvme"}
        zero["offload_param"] = {"device": "nvme"}
    config = with_reference_optimizer({"zero_optimization": zero}, scratch)
    write = {"ZS_TEST_WRITE": "1"}
    out = str(scratch / "ddp-written")
    want = run_ranks([WORKER, "ddp", "gpt", str(STEPS), out], WORLD, out, extra_env=write)
    got = zs_losses("gpt", config, scratch, "written-" + offload, extra_env=write)
    assert_same(got, want)
    assert abs(got[0][0] - ddp_losses("gpt", scratch)[0][0]) > 1e-3  # the write mattered


def test_a_script_that_initialised_torch_distributed_first(scratch):
    """dist.init_process_group("gloo") before initialize (deepspeed.init_distributed(),
    accelerate and the Trainer do it): torch's rank 0 then serves the store at
    MASTER_PORT, and zeroshard joins it instead of failing to listen there. Twice in a
    row in the same store: each engine's keys are its own."""
    config = with_reference_optimizer({"zero_optimization": {"stage": 3}}, scratch)
    got = zs_losses("gpt", config, scratch, "after-dist", extra_env={"ZS_TEST_INIT_DIST": "1"})
    assert_same(got, ddp_losses("gpt", scratch))


@pytest.mark.parametrize("stage", [0, both_legs(3)])
def test_model_zero_grad_between_steps_changes_nothing(stage, scratch):
    """model.zero_grad() (set_to_none) drops the .grad views into the engine's buffers;
    the next backward binds them again (it trained nothing before: the Hugging Face
    Trainer calls it)."""
    config = with_reference_optimizer({"zero_optimization": {"stage": stage}}, scratch)
    got = zs_losses("gpt", config, scratch, f"zero-grad{stage}",
                    extra_env={"ZS_TEST_MODULE_ZERO_GRAD": "1"})
    assert_same(got, ddp_losses("gpt", scratch))
