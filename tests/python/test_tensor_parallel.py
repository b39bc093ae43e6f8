"""Tensor parallelism composed with ZeRO on 4 real ranks (TP2 x DP2, Gloo): a Megatron-style
GPT that the user's own layers split (tests/python/tp_worker.py), handed to
zeroshard.initialize(mpu=...), and the same GPT split by torch's parallelize_module over a
device mesh, handed over with initialize(mesh=...), at stages 1 to 3 and 3 with the
optimizer on the CPU, with gradient clipping active, trains as the unsplit model does in one process with torch's
AdamW: every step's loss, the pre-clip gradient norm (parameters every tp rank holds whole
counted once), and the parameters at the end, joined from their tp slices. A checkpoint
saved at TP2 x DP2 resumes bit-exactly there, loads at TP2 x DP1 and at TP1 x DP2 (and one
saved at TP1 at TP2), and consolidates into the whole parameters."""
import importlib.util
import json
import os

import pytest
import torch

from conftest import HERE, both_legs, main_leg_only, run_ranks, run_snippet

WORKER = os.path.join(HERE, "tp_worker.py")
TP, WORLD, STEPS = 2, 4, 6
_reference = {}


def config(stage, offload=None):
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": offload}
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
            "gradient_clipping": 0.05,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95],
                                                      "eps": 1e-8, "weight_decay": 0.1}},
            "zero_optimization": zero}


def reference(scratch, mode="ref"):
    if mode not in _reference:
        out = str(scratch / mode)
        _reference[mode] = run_ranks([WORKER, mode, "1", str(STEPS), out], 1, out)[0]
    return _reference[mode]


def joined(ranks):
    """The whole parameters from the tp slices of data-parallel rank 0 (ranks 0..TP-1)."""
    out = {}
    for name, value in ranks[0]["params"].items():
        if name in ranks[0]["split"]:
            parts = [torch.tensor(ranks[t]["params"][name]) for t in range(TP)]
            out[name] = torch.cat(parts, dim=ranks[0]["split"][name])
        else:
            out[name] = torch.tensor(value)
    return out


def assert_as_unsplit(got, want):
    for r in got:
        assert (r["dp_world_size"], r["mp_world_size"], r["train_batch_size"]) == (2, 2, 8)
    for step in range(STEPS):
        # Each data-parallel rank's loss is of its own batch; the reference's of them all.
        loss = sum(got[r]["losses"][step] for r in range(0, WORLD, TP)) / (WORLD // TP)
        assert abs(loss - want["losses"][step]) <= 1e-5 * abs(want["losses"][step]), step
        for r in range(WORLD):
            assert abs(got[r]["norms"][step] - want["norms"][step]) <= 1e-5 * want["norms"][step]
    assert min(want["norms"]) > 0.05, "clipping was not active"
    assert want["losses"][-1] < want["losses"][0]
    params = joined(got)
    assert params.keys() == want["params"].keys()
    for name, value in want["params"].items():
        value = torch.tensor(value)  # within 1e-5 of the tensor's largest value
        diff = (params[name] - value).abs().max().item()
        assert diff <= 1e-5 * max(1.0, value.abs().max().item()), f"{name}: {diff}"


def train(mode, stage, offload, scratch, extra=None):
    out = str(scratch / mode)
    return run_ranks([WORKER, mode, str(TP), str(STEPS), out,
                      json.dumps(dict(config(stage, offload), **(extra or {})))], WORLD, out)


@pytest.mark.parametrize("stage,offload", [(1, None), (2, None), both_legs(3, None), (3, "cpu")])
def test_tp2_dp2_through_an_mpu_trains_as_the_unsplit_model(stage, offload, scratch):
    assert_as_unsplit(train("zs", stage, offload, scratch), reference(scratch))


def test_mics_and_nvme_offload_compose_with_tensor_parallelism(scratch):
    """Inside the data-parallel dimension: shard groups of one rank (MiCS: each dp rank's
    state whole, replicated across the two), and stage 3 with the optimizer's state and
    the parameters' shards on NVMe."""
    mics = {"zero_optimization": {"stage": 3, "mics_shard_size": 1}}
    assert_as_unsplit(train("zs", 3, None, scratch, mics), reference(scratch))
    nvme = {"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": str(scratch / "nvme")},
        "offload_param": {"device": "nvme", "nvme_path": str(scratch / "nvme"), "max_in_cpu": 0}}}
    assert_as_unsplit(train("zs", 3, None, scratch, nvme), reference(scratch))


@pytest.mark.parametrize("stage,offload", [(1, None), both_legs(3, None), (3, "cpu")])
def test_a_dtensor_plan_on_a_dp_tp_mesh_trains_as_the_unsplit_model(stage, offload, scratch):
    """torch's parallelize_module (ColwiseParallel, RowwiseParallel) over mesh["tp"] of a
    ("dp", "tp") mesh, then initialize(mesh=mesh)."""
    assert_as_unsplit(train("dtensor", stage, offload, scratch), reference(scratch))


@pytest.mark.parametrize("stage,offload", [(2, None), (3, "cpu")])
def test_sequence_parallel_norms_and_a_split_embedding_train_as_the_unsplit_model(
        stage, offload, scratch):
    """torchtitan's plan: between blocks each tp rank holds a slice of the sequence, the
    norms are SequenceParallel (their weights' gradients summed over the tp ranks), the
    embedding is split by vocabulary (RowwiseParallel out to a sequence slice) and the head
    is colwise from one."""
    assert_as_unsplit(train("sp", stage, offload, scratch), reference(scratch))


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed beside this interpreter (the trixie "
                           "leg): the main leg runs this test")
@pytest.mark.parametrize("stage,offload", [(1, None), (3, None), (3, "cpu")])
def test_a_transformers_llama_split_by_its_own_tp_plan_trains_as_unsplit(stage, offload, scratch):
    """tensor_parallel.autotp_size: 2 (DeepSpeed's key) and nothing else: zeroshard lays the
    Llama's tp_plan (colwise q, k, v, gate, up and lm_head; rowwise o and down) over a mesh."""
    got = train("hf", stage, offload, scratch, {"tensor_parallel": {"autotp_size": TP}})
    assert_as_unsplit(got, reference(scratch, "hfref"))
    if (stage, offload) == (3, None):
        assert_ledger_holds_its_share(got)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed beside this interpreter (the trixie "
                           "leg): the main leg runs this test")
@pytest.mark.parametrize("stage", [2, 3])
def test_autotp_with_the_scripts_mpu_and_adamw_trains_as_unsplit(stage, scratch):
    """DeepSpeed's AutoTP example's shape: tensor_parallel.autotp_size and data_parallel_size
    in the config, the script's own mpu (its groups: consecutive ranks share a tp group) and
    a torch AdamW over model.parameters() given to initialize: the Llama is split by its
    tp_plan over the mpu's groups."""
    got = train("hf_mpu", stage, None, scratch, {"tensor_parallel": {"autotp_size": TP},
                                                 "data_parallel_size": WORLD // TP})
    assert_as_unsplit(got, reference(scratch, "hfref"))


def assert_ledger_holds_its_share(got):
    """Stage 3: each rank's ledger holds 1/(tp x dp) of the split parameters' bytes and 1/dp
    of the whole ones (counted by hand from the Llama's shape, fp32), padding aside; the
    ledger is what the engine's plan predicted; and zeroshard.estimate(tp=2) on the unsplit
    model predicts the same bytes."""
    vocab, dim, inter, heads, kv_heads, layers = 64, 32, 64, 4, 2, 2  # tp_worker.llama()
    kv = dim // heads * kv_heads
    split = layers * (2 * dim * dim + 2 * dim * kv + 3 * dim * inter) + vocab * dim  # + lm_head
    whole = vocab * dim + (2 * layers + 1) * dim  # embedding, norms
    dp = WORLD // TP
    share = 4 * (split / (TP * dp) + whole / dp)
    for r in got:
        kinds = r["memory"]["device"]
        for kind in ("params", "grads_fp32"):
            current, predicted = kinds[kind]
            assert current == predicted, (kind, current, predicted)
            assert share <= current <= 1.02 * share, (kind, current, share)
        assert kinds["optimizer_states"][0] == 2 * kinds["params"][0]
    planned = sum(p for kind, (_, p) in got[0]["memory"]["device"].items() if kind != "activations")
    estimated = got[0]["estimated"]["device"]
    assert abs(estimated - planned) <= 0.02 * planned, (estimated, planned)


def test_checkpoint_resumes_bit_exactly_and_loads_at_other_tp_and_dp_sizes(scratch):
    ckpt, narrow_ckpt = str(scratch / "ckpt"), str(scratch / "ckpt_tp1")
    cfg = json.dumps(config(3, "cpu"))

    def run(tag, tp, world, env, steps=STEPS):
        out = str(scratch / tag)
        return run_ranks([WORKER, "zs", str(tp), str(steps), out, cfg], world, out,
                         extra_env=env)

    whole = run("whole", TP, WORLD, {})
    first = run("first", TP, WORLD, {"ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "3"})
    assert sorted(os.listdir(os.path.join(ckpt, "global_step3"))) == [
        "tensor_parallel.json", "tp_rank_00", "tp_rank_01"]
    again = run("again", TP, WORLD, {"ZS_CKPT_LOAD": ckpt})
    for r in range(WORLD):
        assert again[r]["losses"] == whole[r]["losses"][3:]
        assert again[r]["params"] == whole[r]["params"]
    saved = joined(first)
    # Consolidated: each split parameter its tp slices joined, equal to the engine's own.
    consolidated = str(scratch / "consolidated.pt")
    import zeroshard
    zeroshard.consolidate(ckpt, consolidated)
    state = torch.load(consolidated)
    assert state.keys() == saved.keys()
    for name, value in saved.items():
        assert torch.equal(state[name], value), name
    # TP2 x DP1 from the TP2 x DP2 checkpoint: the same parameters (no step taken).
    narrow = run("narrow", TP, TP, {"ZS_CKPT_LOAD": ckpt}, steps=3)
    for name, value in joined(narrow).items():
        assert torch.equal(value, saved[name]), name

    def as_whole_run(got, tp):
        """Steps 4 to 6 as the TP2 x DP2 run that never stopped, within 1e-5."""
        for step in range(STEPS - 3):
            want = sum(whole[r]["losses"][3 + step] for r in range(0, WORLD, TP)) / (WORLD // TP)
            loss = sum(got[r]["losses"][step] for r in range(0, len(got), tp)) / (len(got) // tp)
            assert abs(loss - want) <= 1e-5 * want, step
        final = joined(whole)
        for name, value in (joined(got) if tp == TP else got[0]["params"]).items():
            value = torch.as_tensor(value)
            diff = (value - final[name]).abs().max().item()
            assert diff <= 1e-5 * max(1.0, final[name].abs().max().item()), f"{name}: {diff}"

    # TP1 x DP2 from it: every split parameter and its Adam state joined from both parts.
    as_whole_run(run("tp1", 1, 2, {"ZS_CKPT_LOAD": ckpt}), 1)
    # And back: a TP1 x DP2 checkpoint loads at TP2 x DP2, each rank cutting its slices.
    run("tp1_save", 1, 2, {"ZS_CKPT_DIR": narrow_ckpt, "ZS_CKPT_SAVE_AT": "3"})
    as_whole_run(run("tp2_again", TP, WORLD, {"ZS_CKPT_LOAD": narrow_ckpt}), TP)


def test_tensor_parallel_peers_fed_different_batches_stop_naming_the_ranks(scratch):
    """A loader split over every rank (tp peers too) would train silently on mixed rows:
    the first training forward fails on every rank, naming the group and the ranks."""
    out = str(scratch / "skew")
    ranks = run_ranks([WORKER, "zs", str(TP), "1", out, json.dumps(config(1))], WORLD, out,
                      extra_env={"ZS_TP_SKEW": "1"}, expect_ok=False)
    for rank, (code, log) in enumerate(ranks):
        first = rank - rank % TP
        assert code != 0, log
        assert (f"training forward 1: the inputs of rank(s) {first + 1} differ from rank "
                f"{first}'s, in one tensor-parallel group (ranks {first} to {first + 1})") in log, log


@main_leg_only
def test_what_cannot_be_split_is_refused_by_name():
    """A tp size for a model with no tp_plan, and an mpu whose size does not divide the
    ranks, each fail naming the cause."""
    code, out = run_snippet(
        "zeroshard.initialize(model=model, config={'tensor_parallel': {'autotp_size': 2}})")
    assert code != 0
    assert ("config key 'tensor_parallel.autotp_size' is 2, but the model (Sequential) "
            "carries no tp_plan") in out, out

    code, out = run_snippet(
        "class Mpu:\n"
        "    get_tensor_model_parallel_world_size = lambda self: 2\n"
        "    get_tensor_model_parallel_rank = lambda self: 0\n"
        "zeroshard.initialize(model=model, config={}, mpu=Mpu())")
    assert code != 0
    assert "mpu: tensor-parallel size 2 does not divide the 1 ranks" in out, out

    code, out = run_snippet("zeroshard.initialize(model=model, config={'data_parallel_size': 2})")
    assert code != 0
    assert ("config key 'data_parallel_size' is 2, but 1 ranks over tensor-parallel size 1, 1 "
            "pipeline stage(s) and sequence-parallel size 1 leave 1 data-parallel ranks; "
            "allowed: 1") in out, out


def test_estimate_with_tp_refuses_a_model_it_cannot_split():
    import zeroshard
    with pytest.raises(ValueError, match=r"tp=2, but the model \(Linear\) carries no tp_plan"):
        zeroshard.estimate(torch.nn.Linear(4, 4), gpus_per_node=2, tp=2)
    with pytest.raises(ValueError, match="tp=2 contradicts the config's "
                                         "tensor_parallel.autotp_size 4"):
        zeroshard.estimate(torch.nn.Linear(4, 4), {"tensor_parallel": {"autotp_size": 4}},
                           gpus_per_node=4, tp=2)

