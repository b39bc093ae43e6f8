"""PyTorch Lightning with zeroshard (zeroshard.integrations.ZeroShardStrategy for the Trainer,
ZeroShardFabricStrategy for Fabric) on 2 real ranks, against the same module or loop under
Lightning's DDPStrategy: a small GPT, AdamW over decay and no-decay groups, a warmup
LambdaLR stepped every optimizer step, accumulation 2, clipping at 0.05 (active at every
step). Every micro-batch's loss and every step's gradient norm within 1e-5 of DDP's,
validate()'s metric and the whole parameters at the end too; ModelCheckpoint (Trainer) and fabric.save resume bit-exactly;
what the engine cannot do as asked is refused by name. The Lightning and Fabric state in
a checkpoint is read without unrestricted unpickling: a payload put in it is refused on
every rank and never runs; one a script hands to save is refused there, by name."""
import importlib.util
import json
import os

import pytest

from conftest import HERE, Payload, run_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="lightning is not installed beside this interpreter (the trixie leg): the main leg "
           "runs these tests")

TRAINER, FABRIC = os.path.join(HERE, "lightning_worker.py"), os.path.join(HERE, "fabric_worker.py")
WORLD = 2
# Lightning takes a torchrun launch from these (TorchElasticEnvironment).
ELASTIC = {"TORCHELASTIC_RUN_ID": "zs", "GROUP_RANK": "0"}
_reference = {}


def run(worker, spec, scratch, world=WORLD, expect_ok=True):
    out = str(scratch / f"{os.path.basename(worker)}{len(list(scratch.iterdir()))}")
    return run_ranks([worker, out, json.dumps(spec)], world, out, timeout=600,
                     extra_env=ELASTIC, expect_ok=expect_ok)


def ddp(worker, scratch):
    if worker not in _reference:
        _reference[worker] = run(worker, {"strategy": "ddp", "epochs": 2}, scratch)
    return _reference[worker]


def assert_same_training(got, want, tolerance=1e-5):
    import torch
    for rank in range(WORLD):
        assert len(got[rank]["losses"]) == len(want[rank]["losses"]) == 16
        for i, (mine, theirs) in enumerate(zip(got[rank]["losses"], want[rank]["losses"])):
            assert abs(mine - theirs) <= tolerance * abs(theirs), f"micro-batch {i}: {mine} vs {theirs}"
        assert len(got[rank]["norms"]) == len(want[rank]["norms"]) == 8
        for i, (mine, theirs) in enumerate(zip(got[rank]["norms"], want[rank]["norms"])):
            assert abs(mine - theirs) <= tolerance * theirs, f"step {i}'s norm: {mine} vs {theirs}"
            assert theirs > 0.05  # clipping is active at every step
    assert want[0]["losses"][-1] < want[0]["losses"][0] / 2
    assert got[0]["params"].keys() == want[0]["params"].keys()
    for name, value in want[0]["params"].items():
        diff = (torch.tensor(got[0]["params"][name]) - torch.tensor(value)).abs().max().item()
        assert diff <= tolerance, f"{name}: {diff}"


STAGE_3 = {"zero_optimization": {"stage": 3}}


def with_payload(ckpt, key, scratch):
    """A copy of the zeroshard checkpoint folder `ckpt` whose Lightning or Fabric state
    (client_state[key] of its manifest) also holds a Payload; returns (copy, marker)."""
    import base64
    import io
    import shutil

    import torch
    copy, marker = str(scratch / f"{key}-payload"), str(scratch / f"{key}-marker")
    shutil.copytree(ckpt, copy)
    patched = 0
    for folder, _, files in os.walk(copy):
        if "manifest.json" not in files:
            continue
        path = os.path.join(folder, "manifest.json")
        manifest = json.load(open(path))
        # This test wrote the state it reads back here, so it loads it whole.
        state = torch.load(io.BytesIO(base64.b64decode(manifest["client_state"][key])),
                           weights_only=False)
        state["note"] = Payload(marker)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        manifest["client_state"][key] = base64.b64encode(buffer.getvalue()).decode("ascii")
        json.dump(manifest, open(path, "w"))
        patched += 1
    assert patched > 0
    return copy, marker


def assert_payload_refused(ranks, copy, marker):
    assert len(ranks) == WORLD
    for code, log in ranks:
        assert code != 0, log
        assert f"checkpoint '{copy}' (its " in log and "): holds posix.mkdir; zeroshard does " \
            "not unpickle objects from a file it did not write" in log, log
        assert "weights_only=False" in log, log
    assert not os.path.exists(marker), "the payload ran"


def test_state_that_would_not_load_back_safely_is_refused_at_save():
    from zeroshard.integrations import lightning as _lightning
    from zeroshard._zeroshard import Error
    with pytest.raises(Error, match=r"ZeroShardFabricStrategy.save_checkpoint: the state holds "
                                    r"posix.mkdir, which a checkpoint keeps only if it loads "
                                    r"back without running code"):
        _lightning.encode_state({"step": 3, "note": Payload("/nonexistent/marker")},
                                "ZeroShardFabricStrategy.save_checkpoint: the state")
    assert _lightning.decode_state(_lightning.encode_state({"step": 3}, "x"), None, "p") == {
        "step": 3}


@pytest.mark.parametrize("strategy", ["zeroshard_stage_2", "stage 3, configure_model",
                                      "zeroshard_stage_3_offload"])
def test_a_lightning_module_trains_as_under_ddp(strategy, scratch):
    spec = {"strategy": strategy, "epochs": 2}
    if strategy.startswith("stage 3"):  # built sharded in configure_model, checkpointed
        spec.update(strategy="zs", config=STAGE_3, configure_model=True,
                    ckpt_dir=str(scratch / "ckpt"))
    got, want = run(TRAINER, spec, scratch), ddp(TRAINER, scratch)
    assert_same_training(got, want)
    for rank in range(WORLD):
        assert got[rank]["global_step"] == want[rank]["global_step"] == 8
        assert abs(got[rank]["val_loss"] - want[rank]["val_loss"]) <= 1e-5 * want[rank]["val_loss"]
    if "ckpt_dir" not in spec:
        return
    # ModelCheckpoint wrote a sharded checkpoint per epoch; fit(ckpt_path=) resumes the
    # second epoch exactly as the run that never stopped.
    assert sorted(os.listdir(spec["ckpt_dir"])) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    resumed = run(TRAINER, dict(spec, ckpt_dir=None,
                                resume=os.path.join(spec["ckpt_dir"], "epoch=0-step=4.ckpt")),
                  scratch)
    for rank in range(WORLD):
        assert resumed[rank]["losses"] == got[rank]["losses"][8:]
        assert resumed[rank]["params"] == got[rank]["params"]
        assert resumed[rank]["global_step"] == 8
    copy, marker = with_payload(os.path.join(spec["ckpt_dir"], "epoch=0-step=4.ckpt"),
                                "lightning", scratch)
    assert_payload_refused(run(TRAINER, dict(spec, ckpt_dir=None, resume=copy), scratch,
                               expect_ok=False), copy, marker)


def test_sequence_parallel_size_splits_each_sample_over_a_group(scratch):
    """lightning_sp_script.py: ZeroShardStrategy(stage=3, sequence_parallel_size=2) on 2
    ranks, a Llama with Ulysses (ALST's registration), each training_step taking its slice
    and returning its share of the loss: both ranks get the same samples from Lightning's
    sampler (its shuffled order), the two shares add up to the whole sequence's loss, and
    gradient norms and parameters after 4 steps are one process's on whole sequences."""
    out = scratch / "sp"
    ranks = run_ranks([os.path.join(HERE, "lightning_sp_script.py"), str(out), "3"], 2, out,
                      timeout=600)
    first, second = ranks
    assert first["seen"] == second["seen"] == first["expected"]
    assert first["dp_world_size"] == 1
    for a, b, (want,) in zip(first["losses"], second["losses"], first["ref_losses"]):
        assert abs(a + b - want) < 1e-5, (a, b, want)
    for rank in ranks:
        assert max(abs(a - b) for a, b in zip(rank["norms"], rank["ref_norms"])) < 1e-5
        assert rank["max_param_diff"] < 1e-5, rank["max_param_diff"]


def test_a_fabric_loop_trains_as_under_ddp_and_resumes_exactly(scratch):
    config = dict(STAGE_3, gradient_accumulation_steps=2, gradient_clipping=0.05)
    spec = {"strategy": "zs", "config": config, "epochs": 2, "ckpt_dir": str(scratch / "ckpt")}
    got = run(FABRIC, spec, scratch)
    assert_same_training(got, ddp(FABRIC, scratch))
    resumed = run(FABRIC, dict(spec, ckpt_dir=None, resume=str(scratch / "ckpt" / "epoch0")),
                  scratch)
    for rank in range(WORLD):
        assert resumed[rank]["losses"] == got[rank]["losses"][8:]
        assert resumed[rank]["params"] == got[rank]["params"]
        assert resumed[rank]["lr"] == got[rank]["lr"]
    copy, marker = with_payload(str(scratch / "ckpt" / "epoch0"), "fabric", scratch)
    assert_payload_refused(run(FABRIC, dict(spec, ckpt_dir=None, resume=copy), scratch,
                               expect_ok=False), copy, marker)


@pytest.mark.parametrize("worker,spec,message", [
    (TRAINER, {"strategy": "zeroshard_stage_2", "rows": 18},
     "ZeroShardStrategy: an epoch has 9 batches per rank, not a multiple of "
     "accumulate_grad_batches 2: each epoch's end cuts a window short"),
    (TRAINER, {"strategy": "zs", "config": {"gradient_clipping": 1.0}},
     "gradient_clipping is 1.0 but Trainer(gradient_clip_val) is 0.05"),
    (TRAINER, {"strategy": "zs", "config": {"optimizer": {"type": "AdamW"}}},
     "the 'optimizer' section is not allowed with Lightning; "
     "LightningModule.configure_optimizers makes it"),
    (FABRIC, {"strategy": "zeroshard_stage_2"},
     "ZeroShardFabricStrategy: fabric.backward() called more than 1 time(s) since the last "
     "optimizer.step(), and the config's gradient_accumulation_steps is 1"),
    (FABRIC, {"strategy": "zs", "config": {"gradient_accumulation_steps": 2}},
     "clip_gradients(max_norm=0.05, norm_type=2): the engine clips the global 2-norm at its "
     "step to the config's gradient_clipping (0.0)"),
], ids=["partial window", "clipping contradicted", "config optimizer", "fabric window",
        "fabric clipping"])
def test_what_the_engine_cannot_do_as_asked_is_refused_by_name(worker, spec, message, scratch):
    ranks = run(worker, dict(spec, epochs=1), scratch, world=1, expect_ok=False)
    for code, log in ranks:
        assert code != 0, log
        assert message in log, log
