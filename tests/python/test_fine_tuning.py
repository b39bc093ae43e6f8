"""Fine-tuning as Hugging Face users run it, on 2 real ranks, against the same run under
DDP: TRL's SFTTrainer training LoRA adapters (peft) at stages 2 and 3, TRL's DPOTrainer
and Seq2SeqTrainer predicting with generation at stage 3, each put on the engine by
zeroshard_trainer(TheirTrainer).

SFT (sft_worker.py): every step's logged loss and grad norm within 1e-5 of DDP's; the
adapter save_model writes loads with PeftModel.from_pretrained and gives DDP's logits
and the trained model's own; at stage 3 the frozen base is sharded like the rest (each
rank holds its shards, the parameter tensors point at placeholders) and no more than two
units are ever gathered at once, though a frozen weight at a unit's start (its
LayerNorm, the base weight of a LoRA layer) is read after every trainable gradient of
the unit; the adapters merged into the sharded base (inside GatheredParameters) leave
the logits as they were. Seq2Seq (seq2seq_worker.py): the logged losses, then DDP's
predictions exactly, where one rank's sequences end before the other's. DPO
(dpo_worker.py): DDP's losses and grad norms with LoRA (the reference is the model with
its adapters off) and with a reference model of its own, sharded by an engine holding
nothing else; sync_ref_model at stage 3 is refused by name."""
import importlib.util
import json
import os

import pytest
import torch

from conftest import HERE, run_ranks

# Marked, not skipped at import (see test_hf_models.py).
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "trl", "peft", "datasets")),
    reason="the Hugging Face stack (transformers, trl, peft, datasets) is not installed beside "
           "this interpreter (the trixie leg): the main leg runs these tests")

WORLD, STEPS = 2, 6
SFT, SEQ2SEQ = os.path.join(HERE, "sft_worker.py"), os.path.join(HERE, "seq2seq_worker.py")
DPO = os.path.join(HERE, "dpo_worker.py")
STAGE3 = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}
_ddp = {}


def run(worker, mode, scratch, tag, config=None, env=None, kind=(), expect_ok=True):
    out = str(scratch / tag)
    args = [worker, mode, *kind, str(STEPS), out] + ([json.dumps(config)] if config else [])
    got = run_ranks(args, WORLD, out, timeout=600, extra_env=env, expect_ok=expect_ok)
    return got, out


def ddp(worker, scratch, checkpointing=False, kind=()):
    """The plain trainer's run under DDP, once per test session and setting."""
    key = (worker, checkpointing, kind)
    if key not in _ddp:
        _ddp[key] = run(worker, "ddp", scratch, f"ddp{int(checkpointing)}", kind=kind,
                        env={"ZS_SFT_CHECKPOINTING": str(int(checkpointing))})
    return _ddp[key]


def assert_logged_alike(got, want, steps=STEPS):
    assert len(got) == len(want) == steps
    for step, ((loss, norm), (loss_ddp, norm_ddp)) in enumerate(zip(got, want)):
        assert abs(loss - loss_ddp) <= 1e-5 * abs(loss_ddp), f"step {step}: {loss} vs {loss_ddp}"
        assert abs(norm - norm_ddp) <= 1e-5 * abs(norm_ddp), f"step {step}: {norm} vs {norm_ddp}"


def adapter_logits(folder):
    """The logits of sft_worker.merge's batch from the base model and the saved adapter."""
    import peft

    import hf_worker
    import models
    model = peft.PeftModel.from_pretrained(hf_worker.make("llama"), folder).eval()
    with torch.no_grad():
        return model(input_ids=torch.arange(3, 3 + models.SEQ).reshape(1, -1)).logits[0, -1]


@pytest.mark.parametrize("zero,checkpointing", [
    (STAGE3, False), ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, False),
    (STAGE3, True)], ids=["stage3", "stage2-cpu-optimizer", "stage3-gradient-checkpointing"])
def test_sft_trainer_with_lora_equals_ddp(zero, checkpointing, scratch):
    import safetensors.torch
    want, want_out = ddp(SFT, scratch, checkpointing)
    got, got_out = run(SFT, "zs", scratch, "zs", {"zero_optimization": zero},
                       env={"ZS_SFT_CHECKPOINTING": str(int(checkpointing))})
    for rank in range(WORLD):
        assert_logged_alike(got[rank]["logged"], want[rank]["logged"])
        assert got[rank]["merge"]["change"] <= 1e-5, got[rank]["merge"]
    mine = safetensors.torch.load_file(got_out + ".adapter/adapter_model.safetensors")
    theirs = safetensors.torch.load_file(want_out + ".adapter/adapter_model.safetensors")
    assert set(mine) == set(theirs) and all("lora_" in name for name in mine), sorted(mine)
    for name, t in theirs.items():
        assert torch.allclose(mine[name], t, rtol=1e-5, atol=1e-6), name
    logits = adapter_logits(got_out + ".adapter")
    assert torch.allclose(logits, adapter_logits(want_out + ".adapter"), atol=1e-5)
    assert torch.allclose(logits, torch.tensor(got[0]["merge"]["before"]), atol=1e-5)
    if zero["stage"] != 3:
        return
    for rank, r in enumerate(got):
        m = r["memory"]
        assert m["frozen"] > 20 * m["trained"], m  # the base is frozen, the adapters train
        total = m["frozen"] + m["trained"]
        # Each unit's trainable and frozen shards, padded to 64 elements.
        assert 4 * total / WORLD <= m["params"] <= 4 * (total / WORLD + 2 * 64 * len(m["units"])), m
        assert m["held_by_parameters"] <= 4 * 2 * len(m["units"]), m  # placeholders only
        assert m["gathered_peak"] <= 4 * 2 * max(m["units"]), (rank, m)


def test_lora_checkpoints_leave_the_frozen_base_out_and_resume(scratch):
    """save_steps 3 at stage 3: the sharded checkpoint holds the adapters and their
    optimizer state alone (the Trainer under DeepSpeed saves a PEFT model so), and a run
    resumed from it logs the uninterrupted run's last 3 steps."""
    full, out = run(SFT, "zs", scratch, "full", {"zero_optimization": STAGE3},
                    env={"ZS_SFT_SAVE_STEPS": "3"})
    ckpt = out + ".trainer/checkpoint-3"
    with open(os.path.join(ckpt, "zeroshard", "global_step3", "manifest.json")) as f:
        saved = [p["name"] for g in json.load(f)["groups"] for p in g["params"]]
    assert saved and all("lora_" in name for name in saved), saved
    resumed, _ = run(SFT, "zs", scratch, "resumed", {"zero_optimization": STAGE3},
                     env={"ZS_SFT_RESUME": ckpt})
    for rank in range(WORLD):
        assert_logged_alike(resumed[rank]["logged"], full[rank]["logged"][3:], STEPS - 3)


def test_seq2seq_trainer_predicts_with_generate_as_ddp_does(scratch):
    want, _ = ddp(SEQ2SEQ, scratch)
    got, _ = run(SEQ2SEQ, "zs", scratch, "zs", {"zero_optimization": STAGE3})
    for rank in range(WORLD):
        assert_logged_alike(got[rank]["logged"], want[rank]["logged"])
        for key in ("full", "end", "ended"):
            assert got[rank][key] == want[rank][key], (rank, key)
        for key in ("full_loss", "ended_loss"):
            assert abs(got[rank][key] - want[rank][key]) <= 1e-5 * want[rank][key], (rank, key)
    # Rank 0's first row ends early, rank 1's goes on: generate kept them in step.
    ended, end = got[0]["ended"], got[0]["end"]
    assert end in ended[0] and end not in ended[1], (end, ended[:2])


@pytest.mark.parametrize("kind", ["lora", "reference"])
def test_dpo_trainer_equals_ddp_with_its_reference_model_sharded(kind, scratch):
    want, _ = ddp(DPO, scratch, kind=(kind,))
    got, _ = run(DPO, "zs", scratch, "zs", {"zero_optimization": STAGE3}, kind=(kind,))
    for rank in range(WORLD):
        assert_logged_alike(got[rank]["logged"], want[rank]["logged"])
        if kind == "lora":  # the reference is the model with its adapters off
            assert "reference" not in got[rank]
            continue
        ref = got[rank]["reference"]
        assert 4 * ref["elements"] / WORLD <= ref["params"] <= 1.05 * 4 * ref["elements"] / WORLD, ref
        held = ref["held_besides"]  # its buffers (rotary frequencies), nothing to train
        assert not any(k.startswith(("grads", "optimizer")) for k in held), ref


def test_dpo_sync_ref_model_at_stage3_is_refused(scratch):
    ranks, _ = run(DPO, "zs", scratch, "sync", {"zero_optimization": {"stage": 3}},
                   env={"ZS_DPO_SYNC_REF": "1"}, kind=("reference",), expect_ok=False)
    for status, log in ranks:
        assert status != 0 and "sync_ref_model=True mixes the policy's weights" in log, log[-2000:]


def test_zeroshard_trainer_takes_trainer_classes_only():
    import transformers

    import zeroshard
    from zeroshard.integrations import ZeroShardTrainer, zeroshard_trainer
    assert zeroshard_trainer(transformers.Trainer) is not transformers.Trainer
    assert issubclass(ZeroShardTrainer, transformers.Trainer)
    seq2seq = zeroshard_trainer(transformers.Seq2SeqTrainer)
    assert seq2seq.__name__ == "ZeroShardSeq2SeqTrainer" and zeroshard_trainer(seq2seq) is seq2seq
    with pytest.raises(zeroshard.Error, match="is not a subclass of transformers.Trainer"):
        zeroshard_trainer(torch.nn.Module)
