"""Hugging Face mixture-of-experts models with their experts split over expert-parallel
ranks by DeepSpeed's AutoEP keys (expert_parallel {enabled, autoep_size}): Mixtral (4
experts) at ZeRO 1 and 2 and Qwen3-MoE (8 experts, each MoE block a stage-3 unit beside its
router) at ZeRO 3, transformers 5's fused 3-D experts, top 2, on 4 ranks at EP=2 x DP=2
(tests/python/moe_ep_script.py), train as one process trains every rank's samples as one
batch: losses, pre-clip gradient norms and parameters after 3 steps within 1e-5, and each
rank's optimizer state is its dense parameters' quarter and its experts' half (their
expert-data-parallel group is 2 ranks), padded to shards as the engine pads them, in the
ledger and in the plan alike; state_dict and save_pretrained give the whole model, every
rank's experts joined, equal to the one-process model's. A checkpoint saved there (each ep
coordinate's rows of the fused experts saved as parts of the whole) resumes at another ep
size as the one process goes on, and consolidates into the whole model. A rank's experts
run in torch's grouped GEMM (counted), or in its loop where the section says
use_grouped_mm false. Qwen3-MoE is built inside zeroshard.init (its experts cut from shards: gathered first, else NaN routes that
hung the exchange)."""
import importlib.util
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

from conftest import (BUILD, HERE, both_legs, main_leg_only, run_ranks, run_snippet,
                      switched_to_zeroshard)

SCRIPT = os.path.join(HERE, "moe_ep_script.py")
# Marked per test, not skipped at import: the DeepSpeed-layer test below runs on both legs.
WITH_TRANSFORMERS = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed beside this interpreter (the trixie leg): the "
           "main leg runs these tests")
ALIGN = 64  # elements per shard's alignment (common/Alignment.h kShardAlignElements)


def padded_shard(numel, ranks):
    return -(-(-(-numel // ranks)) // ALIGN) * ALIGN


@WITH_TRANSFORMERS
@pytest.mark.parametrize("model,stage,resumed_ep,built", [
    ("mixtral", 1, 1, []), ("mixtral", 2, 2, ["--no_grouped_mm"]),
    ("qwen3_moe", 3, 4, ["--zero_init"])])
def test_experts_split_over_ranks_train_as_one_process(model, stage, resumed_ep, built, scratch):
    import zeroshard
    out = str(scratch / model)
    env = {"OMP_NUM_THREADS": "1"}
    ranks = run_ranks([SCRIPT, out, model, str(stage), *built], 4, out, extra_env=env)
    for rank, got in enumerate(ranks):
        assert got["losses"] == pytest.approx(got["want_losses"], abs=1e-5), rank
        assert got["norms"] == pytest.approx(got["want_norms"], rel=1e-5), rank
        assert got["param_diff"] < 1e-5, rank
        # A rank's experts in grouped GEMMs (transformers' default, use_grouped_mm's too):
        # one for gate_up_proj and one for down_proj per MoE layer (2), each again twice in
        # backward (the rows' gradient and the weights'); with use_grouped_mm false, none.
        assert got["grouped_gemms"] == (0 if "--no_grouped_mm" in built else 2 * 2 * 3), rank
        # Adam's m and v (8 bytes an element) of a quarter of the dense parameters and half
        # of this rank's experts (half the model's: half its expert elements), padded per
        # group: one dense and one expert group at stage 1, per unit at stage 3 (fewer than
        # 16 groups, each padded by less than ALIGN; a quarter of this rank's experts is
        # 3,072 elements or more).
        held = got["optimizer_state_bytes"]
        if stage < 3:
            assert held == 8 * (padded_shard(got["dense_numel"], 4)
                                + padded_shard(got["expert_numel"], 2)), rank
        else:
            assert 0 <= held / 8 - got["dense_numel"] / 4 - got["expert_numel"] / 2 < 16 * ALIGN
        assert got["optimizer_state_planned"] == held, rank
        # The whole model from every rank: each expert from the rank holding it, joined as
        # the one-process model holds them, by state_dict and through save_pretrained.
        assert got["whole_keys"], rank
        assert got["whole_diff"]["state_dict"] < 1e-5, (rank, got["whole_diff"])
        assert got["whole_diff"]["from_pretrained"] < 1e-5, (rank, got["whole_diff"])
    assert ranks[0]["expert_numel"] == ranks[1]["expert_numel"] > 0
    # The bytes the ranks put into the experts' all-to-alls in a step: zeroshard-estimate's
    # for the model's config.json at ep 2 (fp32), a rank's mean: each sends its 12 tokens'
    # routes and returns what it was sent, as many rows in all as were sent.
    planned = subprocess.run(
        [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config", f"{out}.config.json",
         "--gpus-per-node", "4", "--ep", "2", "--seq", "12", "--micro-batch", "1", "--fp32",
         "--json"], capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    experts = json.loads(planned.stdout)["exchanges"]["experts"]
    assert sum(got["exchanged_bytes"] for got in ranks) == 4 * experts["bytes_per_micro_step"]
    # Saved at ep 2 after 3 steps, resumed at ep 1 (every rank every expert) or 4 (a rank's
    # 2 experts from parts of 4): the next 3 steps as the one process and the run that
    # went on (a part read at the wrong rows fails both).
    resumed = run_ranks([SCRIPT, f"{out}.resumed", model, str(stage), "--resume", f"{out}.ckpt",
                         str(resumed_ep), *built], 4, f"{out}.resumed", extra_env=env)
    for rank, (went_on, got) in enumerate(zip(ranks, resumed)):
        assert got["losses"] == pytest.approx(got["want_losses"], abs=1e-5), rank
        assert got["losses"] == pytest.approx(went_on["went_on"], abs=1e-6), rank
        assert got["norms"] == pytest.approx(got["want_norms"], rel=1e-5), rank
    # zeroshard.consolidate joins the parts: the state_dict of the whole model when saved.
    zeroshard.consolidate(f"{out}.ckpt", f"{out}.consolidated.pt")
    joined, whole = torch.load(f"{out}.consolidated.pt"), torch.load(f"{out}.whole.pt")
    assert sorted(joined) == sorted(whole)
    for name, want in whole.items():
        assert torch.allclose(joined[name], want.float(), atol=1e-6), name
    # A manifest that lost a part is refused by name, never joined short.
    damaged = scratch / "damaged"
    shutil.copytree(f"{out}.ckpt", damaged)
    manifest = next(damaged.glob("*/manifest.json"))
    saved = json.loads(manifest.read_text())
    part = next(g for g in saved["groups"] if g.get("ranks") and g["ranks"][0] == 1)
    name = part["params"][0]["name"]
    part["params"] = part["params"][1:]
    manifest.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=f"the parts of parameter '{re.escape(name)}' end at "
                                         "element .* the manifest is damaged"):
        zeroshard.consolidate(str(damaged), str(scratch / "damaged.pt"))


@WITH_TRANSFORMERS
@pytest.mark.parametrize("stage", [1, 3])
def test_a_rank_whose_experts_get_no_token_trains_on(stage, scratch):
    """Mixtral's routers skewed so that every route goes to the first expert-parallel rank's
    experts: the other ranks' experts run on no rows, their backward still takes part in
    both exchanges, and the 4 ranks train as one process (losses, norms, parameters).
    Before, those ranks' backward skipped the exchanges and the others waited forever."""
    out = str(scratch / "skewed")
    ranks = run_ranks([SCRIPT, out, "mixtral", str(stage), "--skewed"], 4, out, timeout=120,
                      extra_env={"OMP_NUM_THREADS": "1"})
    for rank, got in enumerate(ranks):
        assert got["losses"] == pytest.approx(got["want_losses"], abs=1e-5), rank
        assert got["norms"] == pytest.approx(got["want_norms"], rel=1e-5), rank
        assert got["param_diff"] < 1e-5, rank


@main_leg_only
def test_dtensor_experts_on_an_ep_mesh_train_as_one_process(scratch):
    """dtensor_ep_script.py on 4 ranks: grouped experts (4, top 2) the script distributed
    with Shard(0) over the ep dimension of a ("dp", "ep") = (2, 2) mesh, its MoE layer
    dispatching routes by all-to-all, the mesh given to initialize, at ZeRO 1, 2 and 3: the
    losses, gradient norms and parameters after 4 steps (state_dict: each weight's two
    halves joined) within 1e-5 of one process training the 4 ranks' samples as one batch.
    Each rank held its 2 experts (taken as dense, ranks holding different experts would
    average their gradients); the checkpoint consolidates into the whole model."""
    out = scratch / "dtensor_ep"
    ranks = run_ranks([os.path.join(HERE, "dtensor_ep_script.py"), str(out), "1,2,3"], 4, out)
    for rank_number, rank in enumerate(ranks):
        for stage in "123":
            trained = rank[f"stage{stage}"]
            for got, want in zip(trained["losses"], rank["ref_losses"]):
                assert abs(got - want[rank_number]) < 1e-5, (stage, got, want)
            for got, want in zip(trained["norms"], rank["ref_norms"]):
                assert abs(got - want) < 1e-5, (stage, got, want)
            assert trained["max_param_diff"] < 1e-5, (stage, trained["max_param_diff"])
            assert (trained["local_shape"], trained["expert_shape"]) == ([2, 24, 16], [4, 24, 16])
    # The checkpoint keeps each rank's experts as rows of the whole weight: consolidated, the
    # whole model's state_dict.
    import zeroshard
    zeroshard.consolidate(f"{out}.ckpt", f"{out}.consolidated.pt")
    joined, whole = torch.load(f"{out}.consolidated.pt"), torch.load(f"{out}.whole.pt")
    assert set(joined) == set(whole)
    for name, tensor in whole.items():
        assert torch.equal(joined[name], tensor), name


@main_leg_only
@pytest.mark.parametrize("names,split,message", [
    (("ep", "dp"), True, "dimensions ('ep', 'dp'): the ep dimension must be the last"),
    (("dp", "ep"), False, "it has an ep dimension of 1 ranks, but no parameter is a DTensor on "
                          "it; allowed: experts distributed over mesh['ep'] with Shard(0)"),
])
def test_an_ep_mesh_that_cannot_be_taken_is_refused_by_name(names, split, message):
    code, out = run_snippet(
        f"import sys; sys.path.insert(0, {HERE!r})\n"
        "import dtensor_ep_script as s\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "zeroshard.init_distributed(dist_backend='gloo')\n"
        f"mesh = init_device_mesh('cpu', (1, 1), mesh_dim_names={names!r})\n"
        "model = s.Model()\n"
        + ("s.split_experts(model, mesh)\n" if split else "") +
        "zeroshard.initialize(model=model, mesh=mesh, config={'zero_optimization': "
        "{'stage': 1}, 'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}}})\n")
    assert code != 0
    assert "zeroshard.initialize: mesh: " + message in out, out


def local_experts(hidden, dtype, rows, asked, device="cpu"):
    """One rank's 2 Mixtral experts over `rows` exchanged rows (_local_experts), forward
    and backward: the grouped GEMMs counted, the output and the gradients (as float32)."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    from zeroshard._experts import hf_expert_parallel
    from moe_ep_script import GroupedGemms
    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=hidden, intermediate_size=16, num_local_experts=2)
    config._experts_implementation = asked
    experts = MixtralExperts(config).to(device, dtype)
    for weight in (experts.gate_up_proj, experts.down_proj):
        torch.nn.init.normal_(weight, std=0.3)
    experts.num_local_experts = 2
    x = torch.randn(rows, hidden, dtype=dtype, device=device, requires_grad=True)
    mine = torch.randint(0, 2, (rows,), device=device)
    with GroupedGemms() as gemms:
        out = hf_expert_parallel._local_experts(experts, x, mine)
        out.backward(torch.randn_like(out))
    return gemms.calls, [t.float().cpu() for t in (out, x.grad, experts.gate_up_proj.grad,
                                                   experts.down_proj.grad)]


@WITH_TRANSFORMERS
@main_leg_only
def test_a_ranks_experts_run_in_one_grouped_gemm_where_torch_takes_the_operands():
    """The exchanged rows of a rank's experts (2 of Mixtral's experts here) in torch's
    grouped GEMM give the loop's outputs and gradients (float32 and bfloat16); operands
    whose rows are not 16-byte multiples (a hidden size of 6 floats), no rows at all, or
    the model's experts_implementation "eager" run the loop."""
    for dtype, tolerance in ((torch.float32, 1e-6), (torch.bfloat16, 2e-2)):
        calls, grouped = local_experts(32, dtype, 20, "grouped_mm")
        assert calls == 6  # 2 in forward, 4 in backward
        loop_calls, loop = local_experts(32, dtype, 20, "eager")
        assert loop_calls == 0
        for got, want in zip(grouped, loop):
            assert torch.allclose(got, want, atol=tolerance, rtol=tolerance), dtype
    assert local_experts(6, torch.float32, 20, "grouped_mm")[0] == 0  # 24-byte rows
    calls, (out, _, gate_up, down) = local_experts(32, torch.float32, 0, "grouped_mm")
    assert calls == 0 and out.shape == (0, 32)
    assert not gate_up.any() and not down.any()  # in the graph, zero: both exchanges run


@WITH_TRANSFORMERS
@main_leg_only
def test_what_autoep_cannot_split_is_refused_by_name():
    import zeroshard
    from zeroshard._common import config as _config
    from zeroshard._experts import hf_expert_parallel
    from long_sequence_reference import make_model
    import moe_ep_script

    def refused(model, section, match):
        loaded = _config.parse({"expert_parallel": dict(enabled=True, **section)})
        with pytest.raises(zeroshard.Error, match=match):
            hf_expert_parallel.apply(model, loaded)

    refused(make_model(), {"autoep_size": 2}, r"^expert_parallel \(AutoEP\): enabled, but "
            r"LlamaForCausalLM has no experts module of fused 3-D weights")
    mixtral = moe_ep_script.make_model("mixtral")
    refused(mixtral, {"autoep_size": 2, "preset_model": "qwen3_moe"},
            r"preset_model is 'qwen3_moe' but the model's model_type is 'mixtral'")
    refused(mixtral, {"preset_model": "gpt_oss"}, r"preset_model is 'gpt_oss'; allowed: mixtral")
    assert hf_expert_parallel.apply(mixtral, _config.parse({"expert_parallel": {}})) == 0
    # use_grouped_mm false asks the model for transformers' loop ("eager"), at any ep size.
    assert mixtral.config._experts_implementation == "grouped_mm"
    loop = _config.parse({"expert_parallel": {"enabled": True, "use_grouped_mm": False}})
    assert hf_expert_parallel.apply(mixtral, loop) == 1
    assert mixtral.config._experts_implementation == "eager"


@pytest.mark.parametrize("stage", [both_legs(2)])
def test_deepspeeds_layer_split_over_ranks_trains_as_every_rank_holding_every_expert(
        stage, scratch):
    """DeepSpeed's MoE layer (tests/python/moe_script.py switched to zeroshard; no DeepSpeed
    needed) at ep_size 2 on 2 ranks against the same script at ep_size 1: the experts start
    alike and see the same tokens, so the losses, l_aux, token counts and gradient norms are
    the same (test_moe.py compares both with DeepSpeed's on the main leg)."""
    script = switched_to_zeroshard(os.path.join(HERE, "moe_script.py"), scratch)
    config = scratch / "config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0, '
                      f'"zero_optimization": {{"stage": {stage}}}, "optimizer": {{"type": '
                      '"AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}')
    env = {"OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([os.path.join(BUILD, "python"), HERE])}
    runs = {}
    for ep in (1, 2):
        out = str(scratch / f"ep{ep}")
        runs[ep] = run_ranks([script, "--deepspeed_config", str(config), "--out", out, "--top_k",
                              "1", "--noisy_gate_policy", "RSample", "--ep_size", str(ep),
                              "--save_16bit", str(scratch / f"saved{ep}")], 2, out,
                             extra_env=env)
    for rank, (whole, split) in enumerate(zip(runs[1], runs[2])):
        assert split["groups"][1] == ["ep_size_2", True, 4], rank  # 2 of the 4 experts
        assert split["counts"] == whole["counts"], rank
        assert split["losses"] == pytest.approx(whole["losses"], abs=1e-6), rank
        assert split["l_aux"] == pytest.approx(whole["l_aux"], abs=1e-6), rank
        assert split["norms"] == pytest.approx(whole["norms"], rel=1e-5), rank
    # save_16bit_model at ep_size 2: every expert, from the rank holding it, under its
    # number in the whole layer (deepspeed_experts.0-3), as the ep_size 1 run saves them.
    saved = [torch.load(scratch / f"saved{ep}" / "pytorch_model.bin") for ep in (1, 2)]
    assert list(saved[1]) == list(saved[0])
    assert "moe.deepspeed_moe.experts.deepspeed_experts.3.0.weight" in saved[1]
    for name, want in saved[0].items():
        assert torch.allclose(saved[1][name], want, atol=1e-6), name
    expert = "moe.deepspeed_moe.experts.deepspeed_experts.{}.0.weight"
    assert not torch.equal(saved[0][expert.format(1)], saved[0][expert.format(2)])  # apart


@pytest.mark.parametrize("stage,world,offload", [(0, 2, False), (1, 2, False), (2, 2, True),
                                                 (3, 2, False), (3, 4, False)])
def test_deepspeeds_layer_checkpoint_resumes_at_any_ep_size(stage, world, offload, scratch):
    """save_checkpoint with DeepSpeed's MoE layer split over 2 ranks (ep_size 2) after 3 of 6
    steps, each rank's file holding its experts under their numbers in the whole layer (on 4
    ranks each expert's state sharded over the 2 ranks holding it): load_checkpoint at
    ep_size 2 and at ep_size 1 (every rank holding every expert) trains the last 3 steps as
    the run that went on did (losses, l_aux within 1e-6, norms within 1e-5), at stages 0-3
    (2 with the optimizer on the host); on 2 ranks one saved at ep_size 1 resumes at ep_size
    2 alike, and zeroshard.consolidate gives the whole layer from either, the same."""
    import zeroshard
    script = switched_to_zeroshard(os.path.join(HERE, "moe_script.py"), scratch)
    config = scratch / "config.json"
    host = ', "offload_optimizer": {"device": "cpu"}' if offload else ""
    config.write_text('{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0, '
                      f'"zero_optimization": {{"stage": {stage}{host}}}, "optimizer": {{"type": '
                      '"AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}')
    env = {"OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([os.path.join(BUILD, "python"), HERE])}

    def run(tag, ep, *extra):
        out = str(scratch / tag)
        return run_ranks([script, "--deepspeed_config", str(config), "--out", out, "--top_k",
                          "1", "--ep_size", str(ep), *extra], world, out, extra_env=env)

    whole = {}
    for saved_ep, loaded_eps in ((2, (2, 1)), (1, (2,)))[:1 if world > 2 else 2]:
        ckpt = str(scratch / f"ckpt-ep{saved_ep}")
        went_on = run(f"save-ep{saved_ep}", saved_ep, "--checkpoint", ckpt, "--save_at", "3")
        for ep in loaded_eps:
            resumed = run(f"ep{saved_ep}-at-ep{ep}", ep, "--checkpoint", ckpt, "--load")
            for rank, (want, got) in enumerate(zip(went_on, resumed)):
                what = (saved_ep, ep, rank)
                assert got["losses"] == pytest.approx(want["losses"][3:], abs=1e-6), what
                assert got["l_aux"] == pytest.approx(want["l_aux"][3:], abs=1e-6), what
                assert got["norms"] == pytest.approx(want["norms"][3:], rel=1e-5), what
        zeroshard.consolidate(ckpt, str(scratch / f"whole-ep{saved_ep}.pt"))
        whole[saved_ep] = torch.load(scratch / f"whole-ep{saved_ep}.pt")
    if world > 2:
        return
    assert sorted(whole[2]) == sorted(whole[1])
    assert "moe.deepspeed_moe.experts.deepspeed_experts.3.0.weight" in whole[2]
    for name, want in whole[1].items():
        assert torch.allclose(whole[2][name], want, atol=1e-6), name

