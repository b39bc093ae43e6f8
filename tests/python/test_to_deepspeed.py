"""A run trained here goes back to DeepSpeed: zeroshard.convert_to_deepspeed_checkpoint
writes a zeroshard checkpoint as DeepSpeed's universal checkpoint, which DeepSpeed 0.19.8
itself loads (`"checkpoint": {"load_universal": true}`) at another data-parallel size and
ZeRO stage. The script (tests/python/autoep_script.py, a Mixtral from a config, its config
without expert_parallel: trained dense) runs under DeepSpeed and, its import pointed at
zeroshard, under zeroshard."""
import json
import os

import pytest

from conftest import BUILD, HERE, OLDEST_LEG, run_ranks, run_snippet, switched_to_zeroshard

pytestmark = pytest.mark.skipif(OLDEST_LEG, reason="DeepSpeed is installed on the main leg only")
SCRIPT = os.path.join(HERE, "autoep_script.py")


def run(scratch, script, stage, ranks, name, *flags, universal=False, ep=0):
    config = scratch / f"{name}.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01,
                                                  "torch_adam": True}},
        **({"checkpoint": {"load_universal": True}} if universal else {}),
        **({"expert_parallel": {"enabled": True, "autoep_size": ep}} if ep else {})}))
    return run_ranks([script, "--deepspeed_config", str(config), "--out", str(scratch / name),
                      *flags], ranks, str(scratch / name),
                     extra_env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
                                "PYTHONPATH": os.pathsep.join([os.path.join(BUILD, "python"),
                                                               HERE])})


def assert_same(got, want):
    for rank, (a, b) in enumerate(zip(got, want)):
        assert a["losses"] == pytest.approx(b["losses"], abs=1e-5), rank
        assert a["norms"] == pytest.approx(b["norms"], rel=1e-5), rank


def test_deepspeed_resumes_a_zeroshard_checkpoint_at_another_stage(scratch):
    """Saved here after 3 of 6 steps (ZeRO 2, 2 ranks) and converted: DeepSpeed at ZeRO 3 on
    the same 2 ranks (each parameter cut by its own loader) gives the 3 steps zeroshard went
    on with (losses within 1e-5, norms 1e-5). (Its ZeRO 1-2 loader: the AutoEP case below.)"""
    import zeroshard
    ours = switched_to_zeroshard(SCRIPT, scratch)
    saved = str(scratch / "zs-ckpt")
    went_on = run(scratch, ours, 2, 2, "zs", "--checkpoint", saved, "--save_at", "3")
    converted = str(scratch / "to-deepspeed")
    assert zeroshard.convert_to_deepspeed_checkpoint(saved, converted) == "global_step3"
    theirs = run(scratch, SCRIPT, 3, 2, "ds3", "--checkpoint", converted, "--load",
                 universal=True)
    assert_same(theirs, [{k: v[3:] for k, v in r.items()} for r in went_on])


def test_deepspeeds_autoep_resumes_experts_split_here_at_any_ep_size(scratch):
    """The Mixtral with its experts split by AutoEP here (autoep_size 2, ZeRO 2, 4 ranks),
    saved after 3 of 6 steps and converted (the fused experts as DeepSpeed's w1, w3 and w2
    of the whole layer, marked as expert parameters; the router as router.gate): DeepSpeed's
    AutoEP at autoep_size 4 on the same 4 ranks (each its own expert, cut by DeepSpeed's
    loader) gives the 3 steps zeroshard went on with (losses within 1e-5, norms 1e-5)."""
    import zeroshard
    ours = switched_to_zeroshard(SCRIPT, scratch)
    saved = str(scratch / "zs-ckpt")
    went_on = run(scratch, ours, 2, 4, "zs", "--checkpoint", saved, "--save_at", "3", ep=2)
    converted = str(scratch / "to-deepspeed")
    zeroshard.convert_to_deepspeed_checkpoint(saved, converted)
    theirs = run(scratch, SCRIPT, 2, 4, "ds-ep4", "--checkpoint", converted, "--load",
                 universal=True, ep=4)
    assert_same(theirs, [{k: v[3:] for k, v in r.items()} for r in went_on])


def test_what_deepspeed_cannot_take_is_refused_by_name_leaving_the_last_conversion(scratch):
    """Buffers written with a warning (DeepSpeed's universal loader leaves them); DeepSpeed
    MoE layer's experts split over ranks, frozen parameters, fp16's dynamic loss scale:
    refused
    naming why; these and a conversion failing midway leave the one of the same tag
    written before whole."""
    import torch
    import zeroshard
    code, said = run_snippet(  # one rank trains a step and saves
        "model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))\n"
        "engine, *_ = zeroshard.initialize(model=model, config={'zero_optimization': "
        "{'stage': 1}, 'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}}})\n"
        "engine.backward(engine(torch.randn(2, 4)).sum())\n"
        "engine.step()\n"
        f"engine.save_checkpoint({str(scratch / 'ckpt')!r}, tag='t')\n"
        f"torch.save(model.state_dict(), {str(scratch / 'weights.pt')!r})\n")
    assert code == 0, said
    out = scratch / "out"
    # The BatchNorm's buffers are written, and said to stay behind in DeepSpeed's run.
    with pytest.warns(UserWarning, match=r"3 buffers \(1.running_mean, 1.running_var, "
                                         r"1.num_batches_tracked\) are written, but "
                                         "DeepSpeed's universal loader restores parameters"):
        zeroshard.convert_to_deepspeed_checkpoint(str(scratch / "ckpt"), str(out))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert (out / "latest_universal").read_text() == "t"
    fp32 = torch.load(out / "t" / "zero" / "0.weight" / "fp32.pt")["param"]
    assert torch.equal(fp32, torch.load(scratch / "weights.pt")["0.weight"])
    manifest = scratch / "ckpt" / "t" / "manifest.json"
    saved = json.loads(manifest.read_text())
    for change, match in (
            (lambda m: m["groups"][0].update(ranks=[0]), "holds DeepSpeed MoE layer experts "
                                                          "split over expert-parallel ranks"),
            (lambda m: m["groups"][0].update(trainable=False), r"holds frozen parameters "
                                                               r"\(0.weight, ...\)"),
            (lambda m: m.update(loss_scale={"scale": 1024.0}), "keeps fp16's dynamic loss")):
        damaged = json.loads(json.dumps(saved))
        change(damaged)
        manifest.write_text(json.dumps(damaged))
        with pytest.raises(zeroshard.Error, match="^convert_to_deepspeed_checkpoint: .*" + match):
            zeroshard.convert_to_deepspeed_checkpoint(str(scratch / "ckpt"), str(out))
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    # A conversion that fails midway (a data file cut short) leaves the last one in place.
    manifest.write_text(json.dumps(saved))
    data = scratch / "ckpt" / "t" / "rank0.bin"
    data.write_bytes(data.read_bytes()[:40])
    with pytest.raises(ValueError, match="is truncated"):
        zeroshard.convert_to_deepspeed_checkpoint(str(scratch / "ckpt"), str(out))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert torch.equal(torch.load(out / "t" / "zero" / "0.weight" / "fp32.pt")["param"], fp32)
