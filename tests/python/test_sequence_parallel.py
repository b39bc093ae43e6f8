"""Ulysses sequence parallelism (zeroshard.sequence.layer, DeepSpeed's names): with each
rank holding a slice of the sequence, DistributedAttention gives the slice of what the
attention gives on the whole sequence in one process, and the gradients of that slice; it
equals DeepSpeed's own DistributedAttention; a transformer trained with it under ZeRO over
the sequence-parallel ranks trains as the same model on whole sequences with torch's AdamW;
DeepSpeed's ALST loop for a Hugging Face model, switched by import, trains as whole
sequences do, with DeepSpeed's losses. Errors name what was given and what is allowed."""
import json
import os
import subprocess

import pytest
import torch

from conftest import BUILD, HERE, OLDEST_LEG, main_leg_only, run_ranks, run_snippet

WORKER = os.path.join(HERE, "sequence_worker.py")
ALST = os.path.join(HERE, "alst_script.py")
CP_SCRIPT = os.path.join(HERE, "cp_script.py")
WORLD = 2


def run(scratch, mode, package="zeroshard"):
    out = scratch / f"{mode}_{package}"
    return run_ranks([WORKER, str(out), mode, package], WORLD, out)


def close(a, b, tol=1e-5):
    a, b = torch.tensor(a), torch.tensor(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=tol, rtol=tol), (a - b).abs().max().item()


@pytest.mark.parametrize("layout", ["batch", "seq", "gqa", "rotary"])
def test_attention_over_slices_is_the_whole_sequences_and_deepspeeds(scratch, layout):
    ours = run(scratch, f"attention-{layout}")
    for rank in ours:
        close(rank["out"], rank["ref_out"])
        for got, want in zip(rank["grads"], rank["ref_grads"]):
            close(got, want)
    if OLDEST_LEG:  # no DeepSpeed in the oldest torch's root
        return
    for a, b in zip(ours, run(scratch, f"attention-{layout}", "deepspeed")):
        assert a["out"] == b["out"] and a["grads"] == b["grads"]  # bit for bit


@pytest.mark.parametrize("stage", [1, 3])
def test_training_over_sequence_slices_is_training_on_whole_sequences(scratch, stage):
    ranks = run(scratch, f"train-{stage}")
    for rank in ranks:
        assert rank["max_param_diff"] < 1e-5, rank["max_param_diff"]
    # Each rank's loss is its slice's mean; their mean is the whole sequence's.
    for step, want in enumerate(ranks[0]["ref_losses"]):
        got = sum(r["losses"][step] for r in ranks) / WORLD
        assert abs(got - want) < 1e-5, (step, got, want)
    assert ranks[0]["losses"] != ranks[1]["losses"]  # the ranks did see different tokens


@pytest.mark.parametrize("stage", [2, 3])
def test_sequence_parallel_size_counts_the_batch_and_sums_gradients_as_deepspeed(scratch,
                                                                                 stage):
    ranks = run(scratch, f"sp-{stage}")
    for rank in ranks:
        assert rank["max_param_diff"] < 1e-5, rank["max_param_diff"]
        assert rank["gradient_accumulation_steps"] == 2  # 2B over micro-batches of B, 1 x 2
        assert (rank["dp_world_size"], rank["seq_dp_world_size"], rank["group_size"],
                rank["train_batch_size"]) == (1, WORLD, WORLD, 4)
    # The ranks of a sequence-parallel group take the same samples.
    assert ranks[0]["samples"] == ranks[1]["samples"]
    assert sorted(sum(ranks[0]["samples"], [])) == list(range(8))
    # Each rank's loss is its share of the group's mean: their sum is the whole sequence's.
    whole = [ranks[0]["losses"][i] + ranks[1]["losses"][i] for i in range(4)]
    # The reference's loss is over both micro-batches of a step.
    for step, want in enumerate(ranks[0]["ref_losses"]):
        got = (whole[2 * step] + whole[2 * step + 1]) / 2
        assert abs(got - want) < 1e-5, (step, got, want)
    if OLDEST_LEG:
        return
    # DeepSpeed 0.19.8 with the same config and mpu: the same accumulation and the same
    # losses, the one after the first step included. (Its parameters after the second
    # step are 1.5e-4 to 2.1e-4 off the one-process reference in every tensor, where
    # these are within 5e-7; the reference is what is held to.)
    theirs = run(scratch, f"sp-{stage}", "deepspeed")
    for ours, ds in zip(ranks, theirs):
        assert ds["gradient_accumulation_steps"] == 2
        assert max(abs(a - b) for a, b in zip(ours["losses"], ds["losses"])) < 1e-5


@main_leg_only
def test_alst_loop_trains_as_whole_sequences_do_and_as_deepspeed(scratch):
    """alst_script.py: a Llama (4 query heads, 2 key-value heads) over 2 ranks, ZeRO 2 then
    3; each rank's loss is the group's token-weighted loss, gathered with torch's
    differentiable all_gather, whose backward sums the gradient over the group: the engine
    takes 1/2 of it, or the gradient norms would be twice the whole sequences'."""
    out = scratch / "alst"
    ours = run_ranks([ALST, str(out), "zeroshard"], WORLD, out)
    for rank in ours:
        for stage in ("stage2", "stage3"):
            close(rank[stage]["losses"], [each for (each,) in rank["ref_losses"]], 1e-6)
            close(rank[stage]["norms"], rank["ref_norms"], 1e-5)
            assert rank[stage]["max_param_diff"] < 1e-6, rank[stage]["max_param_diff"]
    # The adapter: each draw of the two ranks' loaders is two micro-batches, rank 0's sample
    # then rank 1's, each rank holding its half; labels shifted before the halves were cut.
    first, second = (rank["stage2"]["batches"] for rank in ours)
    assert len(first) == len(second) == 4
    for mine, theirs in zip(first, second):
        assert mine["position_ids"] == [list(range(8))]
        assert theirs["position_ids"] == [list(range(8, 16))]
        assert mine["shift_labels"][0] == mine["input_ids"][0][1:] + theirs["input_ids"][0][:1]
        assert theirs["shift_labels"][0] == theirs["input_ids"][0][1:] + [-100]
    assert first[0]["input_ids"] != first[1]["input_ids"]  # the ranks drew different samples
    # DeepSpeed 0.19.8 on the same script: the same losses (its AdamW drifts from torch's by
    # 1.5e-5 in 4 steps, where these are within 5e-7 of it). Its gradient norms: at ZeRO 3
    # these (it averages over every rank); at ZeRO 2 twice these (it divides the group's sum
    # by the data-parallel size alone).
    out = scratch / "alst_deepspeed"
    theirs = run_ranks([ALST, str(out), "deepspeed"], WORLD, out)
    for mine, ds in zip(ours, theirs):
        for stage in ("stage2", "stage3"):
            close(ds[stage]["losses"], mine[stage]["losses"], 5e-5)
        close(ds["stage3"]["norms"], mine["stage3"]["norms"], 1e-5)
        close(ds["stage2"]["norms"], [2 * n for n in mine["stage2"]["norms"]], 2e-5)


@main_leg_only
@pytest.mark.parametrize("sp", [2, 4])
def test_alst_loop_over_sequence_and_data_parallel_ranks_trains_as_whole_sequences(scratch, sp):
    """alst_script.py on 4 ranks: SP=2 x DP=2 (groups 0-1 and 2-3) and SP=4 (key-value
    heads repeated to the 4 ranks), at ZeRO 1, 2, 3 and 3 with the optimizer and parameters
    on the CPU: every step's loss is its group's sample's as one process computes it on the
    whole sequence, and the gradient norms and parameters after 4 steps are those of that
    process training each step's samples of all groups as one batch (so ZeRO shards over
    every rank, sums the gradients over each group and divides by the data-parallel ranks
    alone)."""
    world, stages = 4, ("1", "2", "3", "3cpu")
    out = scratch / f"alst_sp{sp}"
    ranks = run_ranks([ALST, str(out), "zeroshard", str(sp), ",".join(stages)], world, out)
    for rank_number, rank in enumerate(ranks):
        dp_rank = rank_number // sp
        for stage in stages:
            trained = rank[f"stage{stage}"]
            assert (trained["dp_world_size"], trained["seq_dp_world_size"]) == (world // sp,
                                                                                 world)
            close(trained["losses"], [each[dp_rank] for each in rank["ref_losses"]], 1e-5)
            close(trained["norms"], rank["ref_norms"], 1e-5)
            assert trained["max_param_diff"] < 1e-5, (stage, trained["max_param_diff"])
    # Each rank holds 1/sp of a sample; at SP=2 x DP=2 the two groups train different ones
    # (the gradient of ALST's gathered loss, over the group of ranks 2 and 3, is what
    # torch's Gloo all_gather could not take).
    first = [rank["stage1"]["batches"][0]["input_ids"][0] for rank in ranks]
    assert all(len(ids) == 16 // sp for ids in first)
    # What each rank put into the attention layers' exchanges in a step is
    # zeroshard-estimate's for the model's config.json at this sp (fp32, 16 tokens).
    assert [rank["stage1"]["exchanged_bytes"] for rank in ranks] == \
        [planned_exchange(scratch, "--sp", sp, "sequence")] * world
    if sp == 2:
        assert first[0] + first[1] != first[2] + first[3]


def planned_exchange(scratch, flag, size, kind):
    """zeroshard-estimate's bytes a rank puts into the `kind` exchanges in a micro-step, for
    the long-sequence scripts' Llama (fp32, a micro-batch of one sequence of 16 tokens)
    split over `size` ranks by `flag` (--sp or --cp)."""
    from long_sequence_reference import CONFIG
    CONFIG.to_json_file(str(scratch / "llama.json"))
    planned = subprocess.run(
        [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config",
         str(scratch / "llama.json"), "--attn-implementation", "sdpa", "--gpus-per-node", "4",
         flag, str(size), "--seq", "16", "--micro-batch", "1", "--fp32", "--json"],
        capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    return json.loads(planned.stdout)["exchanges"][kind]["bytes_per_micro_step"]


@main_leg_only
def test_tiled_mlp_and_logits_loss_train_as_the_whole_mlp_and_logits_do(scratch):
    """alst_script.py tiled on 2 ranks (SP=2): the tutorial's TiledMLP patched into
    LlamaMLP.forward (4 tiles) and TiledFusedLogitsLoss over the last hidden states (2
    tiles), at ZeRO 1, 2, 3 and 3 offloaded: losses and gradient norms those of whole
    sequences through the whole MLP and logits in one process. Each parameter's gradient
    arrives once per backward, though every tile adds to it (DeepSpeed's flag on the last
    tile is not needed); the loss's backward, run inside its forward, gives the engine
    nothing before engine.backward."""
    stages = ("1", "2", "3", "3cpu")
    out = scratch / "tiled"
    ranks = run_ranks([ALST, str(out), "zeroshard", "2", ",".join(stages), "tiled"], WORLD, out)
    for rank in ranks:
        for stage in stages:
            trained = rank[f"stage{stage}"]
            close(trained["losses"], [each for (each,) in rank["ref_losses"]], 1e-6)
            close(trained["norms"], rank["ref_norms"], 2e-6)
            # The tiles' sums round differently (gradients 1e-7 apart relative); Adam's
            # steps on near-zero gradients make that 1.5e-5 in 4 steps (untiled: 4e-7).
            assert trained["max_param_diff"] < 5e-5, (stage, trained["max_param_diff"])
    # DeepSpeed 0.19.8's own TiledMLP and TiledFusedLogitsLoss on the same script, ZeRO 2
    # and 3: the same losses (its AdamW drifts 1.5e-5 from torch's in 4 steps). (Its
    # gradient norms there are 10x and 5x the whole model's: not compared.)
    out = scratch / "tiled_deepspeed"
    theirs = run_ranks([ALST, str(out), "deepspeed", "2", "2,3", "tiled"], WORLD, out)
    for mine, ds in zip(ranks, theirs):
        for stage in ("stage2", "stage3"):
            close(ds[stage]["losses"], mine[stage]["losses"], 5e-5)


@main_leg_only
def test_ring_attention_over_a_cp_mesh_trains_as_whole_sequences(scratch):
    """cp_script.py on 4 ranks: torch's context_parallel over the "cp" dimension of a
    ("dp", "cp") = (2, 2) mesh given to initialize, on CPU tensors (sdpa's CPU kernel run in
    torch's ring, which dispatches CUDA kernels only), at ZeRO 1, 2, 3 and 3 with the
    optimizer and parameters on the CPU: a group's two shares of each step's loss add up to
    its sample's whole-sequence loss, and gradient norms and parameters after 4 steps are
    one process's on both groups' samples as one batch (so the cp ranks' gradients are
    summed and divided by the data-parallel ranks alone, and a batch counts them once); the
    bytes of the ring's rotations are the estimator's."""
    world, stages = 4, ("1", "2", "3", "3cpu")
    out = scratch / "cp"
    ranks = run_ranks([CP_SCRIPT, str(out), "2", ",".join(stages)], world, out)
    ref_losses, ref_norms = ranks[0]["ref_losses"], ranks[0]["ref_norms"]
    for stage in stages:
        trained = [rank[f"stage{stage}"] for rank in ranks]
        for group in range(2):
            shares = zip(trained[2 * group]["losses"], trained[2 * group + 1]["losses"])
            close([a + b for a, b in shares], [each[group] for each in ref_losses], 1e-5)
        for rank in trained:
            close(rank["norms"], ref_norms, 1e-5)
            assert rank["max_param_diff"] < 1e-5, (stage, rank["max_param_diff"])
            assert (rank["dp_world_size"], rank["seq_dp_world_size"],
                    rank["train_batch_size"]) == (2, 4, 2)
    # torch's head-tail load balancing: the first cp rank holds the first and last quarters.
    assert ranks[0]["stage1"]["positions"][0] == [0, 1, 2, 3, 12, 13, 14, 15]
    assert ranks[1]["stage1"]["positions"][0] == list(range(4, 12))
    # What each rank put into the ring's rotations in a step is zeroshard-estimate's --cp 2:
    # per layer its 8 tokens' keys and values (2 heads of 8) gathered each way and their
    # gradients passed twice (8,192 bytes over the 2 layers).
    assert [rank["stage1"]["exchanged_bytes"] for rank in ranks] == \
        [planned_exchange(scratch, "--cp", 2, "ring")] * world == [8192] * world


@main_leg_only
@pytest.mark.parametrize("layout, message", [
    ("uneven", "DistributedAttention: 3 query heads do not split evenly over a "
               "sequence-parallel group of 2 ranks; allowed: a head count divisible by 2"),
    ("fewkv", "DistributedAttention: 1 key-value heads over a sequence-parallel group of 2 "
              "ranks leave a rank no head to attend over; allowed: at least 2 key-value heads"),
])
def test_heads_that_do_not_split_are_refused_by_name(scratch, layout, message):
    out = scratch / layout
    for code, log in run_ranks([WORKER, str(out), f"attention-{layout}", "zeroshard"], WORLD,
                               out, expect_ok=False):
        assert code != 0 and message in log, log[-2000:]


@main_leg_only
def test_groups_and_layouts_that_cannot_be_are_refused_by_name():
    code, out = run_snippet(
        "from zeroshard.sequence.layer import DistributedAttention\n"
        "import torch.distributed as dist\n"
        "zeroshard.init_distributed()\n"
        "a = DistributedAttention(lambda q, k, v: q, dist.group.WORLD)\n"
        "from zeroshard.runtime.sequence_parallel import parallel_state_sp as sp\n"
        "try:\n"
        "    sp.initialize_sequence_parallel(2)\n"
        "except zeroshard.Error as e:\n"
        "    print('E1', e)\n"
        "try:\n"
        "    sp.get_sequence_parallel_group()\n"
        "except zeroshard.Error as e:\n"
        "    print('E2', e)\n"
        "try:\n"
        "    DistributedAttention(None, dist.group.WORLD, scatter_idx=0)\n"
        "except zeroshard.Error as e:\n"
        "    print('E3', e)\n"
        "from zeroshard.runtime.sequence_parallel import ulysses_sp\n"
        "try:\n"
        "    ulysses_sp.UlyssesSPAttentionHF.register_with_transformers(None, 'eager', 2, 1)\n"
        "except zeroshard.Error as e:\n"
        "    print('E4', e)\n"
        "from zeroshard.utils import groups\n"
        "print('SIZE', groups._get_sequence_parallel_world_size(),\n"
        "      groups._get_sequence_parallel_rank())\n"
        "try:\n"
        "    groups._get_sequence_parallel_group()\n"
        "except KeyError as e:\n"
        "    print('E5', e)\n"
        "try:\n"
        "    from zeroshard.runtime.sequence_parallel.ulysses_sp import sequence_tiled_compute\n"
        "except ImportError as e:\n"
        "    print('E6', e)\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "model = torch.nn.Linear(2, 2)\n"
        "for names, cfg in ((('cp', 'dp'), {}), (('dp', 'cp'), {'sequence_parallel_size': 2})):\n"
        "    try:\n"
        "        zeroshard.initialize(model=model, config=dict(cfg, train_micro_batch_size_per_gpu=1),\n"
        "                             mesh=init_device_mesh('cpu', (1, 1), mesh_dim_names=names))\n"
        "    except zeroshard.Error as e:\n"
        "        print('E7', e)\n")
    assert code == 0, out
    assert ("E1 initialize_sequence_parallel: sequence_parallel_size=2 over 1 ranks; allowed: "
            "an integer above 1 that divides the world size 1") in out, out
    assert "E2 the sequence-parallel group is not made; call initialize_sequence_parallel" in out
    assert "E3 DistributedAttention: scatter_idx=0; allowed: 2" in out
    assert ("E4 UlyssesSPAttentionHF: core_attn_implementation='eager' needs a 4-D attention "
            "mask over the whole sequence; allowed: 'sdpa'") in out, out
    assert "SIZE 1 0" in out  # no groups: a size of 1, as DeepSpeed's getters say
    assert "E5 no sequence-parallel group: none is made; allowed: after" in out
    assert ("E6 deepspeed.runtime.sequence_parallel.ulysses_sp.sequence_tiled_compute is not in "
            "zeroshard: ALST's generic tiled compute") in out, out
    assert ("E7 zeroshard.initialize: mesh: dimensions ('cp', 'dp'): the cp dimension must be "
            "the last") in out, out
    assert ("E7 zeroshard.initialize: mesh: a cp dimension of 1 ranks and the config's "
            "sequence_parallel_size 2; allowed: one of the two") in out, out
