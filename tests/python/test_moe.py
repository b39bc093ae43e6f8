"""DeepSpeed's mixture-of-experts layer (zeroshard.moe): its gating routes, weights and
drops tokens as DeepSpeed 0.19.8's does from the same draws, and a cifar-style MoE script
(tests/python/moe_script.py) switched to zeroshard by its imports gives DeepSpeed's own
losses, l_aux, token counts and gradient norms on 2 ranks at ZeRO 1 and 2 with every rank
holding every expert, and the same at ZeRO 3, which DeepSpeed's MoE refuses; with the
experts split over 2 expert-parallel ranks (ep_size 2) at ZeRO 0, 1 and 2 on 2 ranks and at
ZeRO 2 and 3 on 4 (each expert then on 2 ranks, its state, and at 3 its parameters, sharded
over them). DeepSpeed's own checkpoints of the layer load here at any ep size."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, HERE, OLDEST_LEG, run_ranks, switched_to_zeroshard

SCRIPT = os.path.join(HERE, "moe_script.py")
pytestmark = pytest.mark.skipif(OLDEST_LEG, reason="DeepSpeed is installed on the main leg only")
CASES = {  # name: (ZeRO stage, script flags)
    "top1-rsample": (1, ["--top_k", "1", "--noisy_gate_policy", "RSample"]),
    "top2-jitter-residual": (2, ["--top_k", "2", "--noisy_gate_policy", "Jitter",
                                 "--use_residual", "--min_capacity", "0"]),
    "ep2-top1-rsample": (1, ["--top_k", "1", "--noisy_gate_policy", "RSample", "--ep_size", "2"]),
}


def run(scratch, script, stage, flags, name, ranks=2, **more):
    config = scratch / f"{name}.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0, "steps_per_print": 1000,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01,
                                                  "torch_adam": True}}, **more}))
    return run_ranks([script, "--deepspeed_config", str(config), "--out", str(scratch / name)]
                     + flags, ranks, str(scratch / name),
                     extra_env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
                                # the switched copy imports rank_result from here
                                "PYTHONPATH": os.pathsep.join([os.path.join(BUILD, "python"),
                                                               HERE])})


def assert_same(ours, theirs, groups=True):
    for rank, (got, want) in enumerate(zip(ours, theirs)):
        assert not groups or got["groups"] == want["groups"], rank
        assert got["counts"] == want["counts"], rank
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-5), rank
        assert got["l_aux"] == pytest.approx(want["l_aux"], abs=1e-5), rank
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-5), rank


@pytest.mark.parametrize("case", list(CASES))
def test_a_moe_script_gives_deepspeeds_numbers(case, scratch):
    stage, flags = CASES[case]
    theirs = run(scratch, SCRIPT, stage, flags, "ds")
    switched = switched_to_zeroshard(SCRIPT, scratch)
    assert_same(run(scratch, switched, stage, flags, "zs"), theirs)
    # fc1, the gate, fc3 (and the residual MLP and its coefficient); each rank's experts'
    # weight and bias (4 experts, or 2 on each of 2 expert-parallel ranks)
    dense = 5 + 4 * flags.count("--use_residual")
    ep = int(flags[flags.index("--ep_size") + 1]) if "--ep_size" in flags else 1
    assert theirs[0]["groups"] == [["parameters", False, dense], [f"ep_size_{ep}", True, 8 // ep]]
    if ep > 1:
        # Each rank's experts see both ranks' tokens, reduced over no other rank and divided
        # by both; the norm sums both ranks' experts: at stages 0 and 2 as well.
        assert_same(run(scratch, switched, 2, flags, "zs2"), theirs)
        assert_same(run(scratch, switched, 0, flags, "zs0"), theirs)
        # 4 ranks: each expert on 2 of them (edp), reduced and its state sharded over those.
        theirs = run(scratch, SCRIPT, 2, flags, "ds4", ranks=4)
        assert_same(run(scratch, switched, 2, flags, "zs4", ranks=4), theirs)
        # And at stage 3, which DeepSpeed refuses: each unit's experts gathered over theirs.
        assert_same(run(scratch, switched, 3, flags, "zs4-3", ranks=4), theirs)
    elif stage == 2:  # DeepSpeed refuses its MoE at ZeRO 3; zeroshard shards the experts too
        assert_same(run(scratch, switched, 3, flags, "zs3"), theirs)


@pytest.mark.parametrize("stage,world", [(1, 2), (2, 4)])
def test_deepspeeds_own_moe_checkpoint_resumes_here_at_any_ep_size(stage, world, scratch):
    """DeepSpeed's own checkpoint of its MoE layer at ep_size 2 (ZeRO 1 on 2 ranks; ZeRO 2 on
    4, each expert's state cut over the 2 ranks holding it), saved after 3 of 6 steps, loads
    here at ep_size 2 and at ep_size 1 (the experts renumbered in the whole layer): the
    next 3 steps give what DeepSpeed's own resume gives (losses, l_aux, counts within 1e-5,
    norms)."""
    ckpt = str(scratch / "ckpt")

    def flags(ep, *more):
        return ["--top_k", "1", "--ep_size", str(ep), "--checkpoint", ckpt, *more]
    run(scratch, SCRIPT, stage, flags(2, "--save_at", "3"), "ds-save", world)
    theirs = run(scratch, SCRIPT, stage, flags(2, "--load"), "ds-load", world)
    switched = switched_to_zeroshard(SCRIPT, scratch)
    for ep in (2, 1):
        assert_same(run(scratch, switched, stage, flags(ep, "--load"), f"zs-ep{ep}", world),
                    theirs, groups=ep == 2)


@pytest.mark.parametrize("model,stage,eps", [("mixtral", 2, (4,)), ("qwen2_moe", 3, (1,))])
def test_deepspeeds_own_autoep_checkpoint_resumes_here_at_any_ep_size(model, stage, eps,
                                                                      scratch):
    """DeepSpeed's own checkpoint of a Hugging Face MoE model whose experts its AutoEP split
    over 2 ranks (autoep_size 2 on 4 ranks: each expert's state, and at ZeRO 3 its
    parameters, cut over the 2 ranks holding it; DeepSpeed's w1, w3 and w2 of each rank's
    experts, its router and Qwen2-MoE's shared expert and gate under its own names), saved
    after 3 of 6 steps (Mixtral at ZeRO 2, Qwen2-MoE at 3), loads here (the fused
    gate_up_proj and down_proj of the whole model, the model's names) at autoep_size 4
    (Mixtral: each rank one expert's rows) and 1 (Qwen2-MoE: every expert on every rank):
    the next 3 steps' losses within 1e-5 of DeepSpeed's own resume, norms 1e-5."""
    script = os.path.join(HERE, "autoep_script.py")
    ckpt = str(scratch / "ckpt")
    flags = ["--checkpoint", ckpt, "--model", model]
    autoep = {"expert_parallel": {"enabled": True, "autoep_size": 2},
              "train_micro_batch_size_per_gpu": 1}
    run(scratch, script, stage, flags + ["--save_at", "3"], "ds-save", 4, **autoep)
    theirs = run(scratch, script, stage, flags + ["--load"], "ds-load", 4, **autoep)
    switched = switched_to_zeroshard(script, scratch)
    for ep in eps:
        autoep["expert_parallel"]["autoep_size"] = ep
        ours = run(scratch, switched, stage, flags + ["--load"], f"zs-ep{ep}", 4, **autoep)
        for rank, (got, want) in enumerate(zip(ours, theirs)):
            assert got["losses"] == pytest.approx(want["losses"], abs=1e-5), (ep, rank)
            assert got["norms"] == pytest.approx(want["norms"], rel=1e-5), (ep, rank)


@pytest.mark.parametrize("world", [2, 4])
def test_split_experts_built_in_zero_init_keep_their_own_values(world, scratch):
    """Each rank's experts initialised with values of their own, the model built inside
    zero.Init at ZeRO 3 with ep_size 2: every expert starts from the first rank holding it
    (DeepSpeed's broadcast over the expert-data-parallel group), as DeepSpeed's engine
    starts it at ZeRO 1 (2 ranks) and 2 (4 ranks) without zero.Init: the same losses, l_aux,
    counts and norms. (zero.Init gave every rank rank 0's experts: other routes, losses 7e-3
    off.)"""
    flags = ["--top_k", "1", "--ep_size", "2", "--distinct_experts"]
    theirs = run(scratch, SCRIPT, world // 2, flags, "ds", world)
    switched = switched_to_zeroshard(SCRIPT, scratch)
    assert_same(run(scratch, switched, 3, flags + ["--zero_init"], "zs", world), theirs)


def test_deepspeed_moe_checkpoints_not_converted_are_refused_by_name(scratch):
    """A DeepSpeed MoE checkpoint (its experts a `moe` group) laid out with
    use_data_before_expert_parallelism, or whose expert group holds what is no expert of
    DeepSpeed's layer; an AutoEP one whose placement misses an expert, whose experts are
    not the fused ones, whose w1, w3, w2 do not fit together, or (ZeRO 3) whose experts share
    a group with other parameters: each is refused naming why; nothing is left written."""
    import torch
    import zeroshard
    import deepspeed_layout
    expert = "moe.deepspeed_moe.experts.deepspeed_experts.0.weight"
    autoep = [{"module_path": "moe", "num_experts": 2,
               "expert_placement": {"ranks": [{"rank": 0, "experts": [0]},
                                              {"rank": 1, "experts": [1]}]}}]
    grouped = {f"moe.experts.{w}": torch.randn(1, 3, 2) for w in ("w1", "w3")}
    grouped["moe.experts.w2"] = torch.randn(1, 2, 3)
    missing = [dict(autoep[0], expert_placement={"ranks": [{"rank": 0, "experts": [0]},
                                                           {"rank": 1, "experts": [0]}]})]
    cases = [
        ({"ds_config": {"use_data_before_expert_parallelism": True}}, {expert: 1},
         "use_data_before_expert_parallelism true .* allowed: DeepSpeed's default layout"),
        ({}, {"moe.gate.weight": 1}, "expert group 1 holds 'moe.gate.weight', which is no expert"),
        ({"ds_autoep_layers": missing}, grouped, r"AutoEP layer moe: its placement \{0: \[0\], "
         r"1: \[0\]\} does not hold each of its 2 experts once"),
        ({"ds_autoep_layers": autoep, "ds_config": {"expert_parallel": {"expert_w3": "up"}}},
         grouped, "AutoEP's expert_parallel.expert_w3 is 'up': not converted; allowed: None"),
        ({"ds_autoep_layers": autoep}, dict(grouped, **{"moe.experts.w2": torch.randn(1, 3, 2)}),
         r"AutoEP layer moe: experts.w1, w3, w2 of shapes \[\[1, 3, 2\], \[1, 3, 2\], "
         r"\[1, 3, 2\]\]; allowed: \[L, I, H\]"),
    ]
    for i, (extra, experts, match) in enumerate(cases):
        experts = {n: torch.randn(4, 2) if isinstance(t, int) else t for n, t in experts.items()}
        params = [{"fc.weight": torch.randn(3, 2)}, experts]
        deepspeed_layout.stage12(scratch / f"ds{i}" / "global_step2", 2, params, {}, stage=1,
                                 extra=extra, param_groups=[{}, {"moe": True}])
        with pytest.raises(zeroshard.Error, match=match):
            zeroshard.convert_deepspeed_checkpoint(str(scratch / f"ds{i}"), str(scratch / f"o{i}"))
        assert not (scratch / f"o{i}" / "global_step2" / "rank0.bin").exists()
    # ZeRO 3: AutoEP's experts cut over their coordinate's ranks, so in a group of their own.
    deepspeed_layout.stage3(scratch / "zero3" / "global_step2", 2,
                            [dict(grouped, **{"fc.weight": torch.randn(3, 2)})], {}, {},
                            extra={"ds_autoep_layers": [dict(autoep[0], ep_size=2)]})
    with pytest.raises(zeroshard.Error, match="group 0 holds AutoEP's experts beside other "
                                              "parameters; allowed: the experts in a group"):
        zeroshard.convert_deepspeed_checkpoint(str(scratch / "zero3"), str(scratch / "out3"))


GATING = """
import torch
import deepspeed.moe.sharded_moe as ds
from zeroshard.moe import sharded_moe as zs
cases = [(k, drop, rts, noisy, tokens, cf, mincap, sparse)
         for k in (1, 2, 3) for drop in (True, False) for rts in (True, False)
         for noisy in (None, "RSample") for tokens in (7, 16) for cf in (0.5, 1.25)
         for mincap in (0, 2) for sparse in (True, False)]
checked = 0
for k, drop, rts, noisy, tokens, cf, mincap, sparse in cases:
    if k > 1 and (rts is False or noisy):
        continue  # those flags are top-1's
    logits = torch.randn(tokens, 5, generator=torch.Generator().manual_seed(tokens + k))
    got, want = [], []
    for module, out in ((zs, got), (ds, want)):
        torch.manual_seed(7)
        x = logits.clone().requires_grad_()
        y = x * 1  # not a leaf: top-2 adds its noise in place
        if k == 1:
            r = module.top1gating(y, cf, mincap, None, noisy, drop, rts, None, sparse)
        elif k == 2:
            r = module.top2gating(y, cf, mincap, drop, None, True, sparse)
        else:
            r = module.topkgating(y, k, cf, mincap, drop, None, "probs", sparse)
        weights = r[5] if sparse else r[1]
        (r[0] + (weights * torch.arange(weights.numel()).view_as(weights)).sum()).backward()
        out.extend([float(r[0]), x.grad] + ([int(r[1]), r[2], r[3].tolist(), r[4].tolist(),
                                             r[5].detach(), r[6].tolist()] if sparse else
                                            [r[1].detach(), r[2], r[3].tolist()]))
    for i, (a, b) in enumerate(zip(got, want)):
        same = torch.allclose(a, b, atol=1e-6) if torch.is_tensor(a) and a.is_floating_point() \
            else (torch.equal(a, b) if torch.is_tensor(a) else a == b)
        assert same, (k, drop, rts, noisy, tokens, cf, mincap, sparse, i, a, b)
    checked += 1
print("checked", checked)
"""


def test_the_gating_routes_weights_and_drops_as_deepspeeds():
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), DS_ACCELERATOR="cpu")
    r = subprocess.run([sys.executable, "-c", GATING], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "checked 192" in r.stdout, r.stdout


def test_what_expert_parallelism_cannot_split_is_refused_by_name():
    import zeroshard
    from zeroshard.moe.layer import MoE
    import torch
    with pytest.raises(zeroshard.Error, match=r"^deepspeed\.moe\.layer\.MoE: ep_size=3 does not "
                                              r"divide num_experts=4; allowed: a divisor"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=4, ep_size=3)
    with pytest.raises(zeroshard.Error, match=r"ran before its expert-parallel group was made"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=4, ep_size=2)(torch.randn(6, 8))
    with pytest.raises(zeroshard.Error, match=r"noisy_gate_policy='Gumbel'; allowed: None"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=4, noisy_gate_policy="Gumbel")
