"""accelerate scripts with zeroshard (zeroshard.integrations.Accelerator) on 2 real ranks
against the same loop under accelerate's own Accelerator (DDP): run_clm_no_trainer's
shape (accumulate() over 2 micro-batches, clipping at 1.0 at the boundary, AdamW with decay
and no-decay groups, a linear schedule with warmup), at stages 2 and 3: every micro-batch's
loss within 1e-5, the whole parameters at the end within 1e-5; what would shard twice, or
be dropped, is refused by name."""
import importlib.util
import json
import os

import pytest

from conftest import HERE, run_ranks, run_snippet

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None or importlib.util.find_spec("transformers") is None,
    reason="accelerate and transformers are not installed beside this interpreter (the trixie "
           "leg): the main leg runs these tests")

WORKER = os.path.join(HERE, "accelerate_worker.py")
STEPS, WORLD = 5, 2
_reference = []


def run(mode, scratch, config=None):
    out = str(scratch / (mode + json.dumps(config or {}).replace(" ", "")[:40].replace("/", "")))
    args = [WORKER, mode, str(STEPS), out] + ([json.dumps(config)] if config else [])
    return run_ranks(args, WORLD, out, timeout=600)


@pytest.mark.parametrize("stage", [2, 3])
def test_an_accelerate_loop_trains_as_accelerate_ddp_does(stage, scratch):
    import torch
    if not _reference:
        _reference.append(run("accelerate", scratch))
    want = _reference[0]
    got = run("zs", scratch, {"zero_optimization": {"stage": stage}, "gradient_clipping": 1.0})
    for rank in range(WORLD):
        assert len(got[rank]["losses"]) == len(want[rank]["losses"]) == STEPS * 2
        for step, (mine, theirs) in enumerate(zip(got[rank]["losses"], want[rank]["losses"])):
            assert abs(mine - theirs) <= 1e-5 * abs(theirs), f"micro-batch {step}: {mine} vs {theirs}"
        assert got[rank]["unwrapped"] == want[rank]["unwrapped"] == "LlamaForCausalLM"
    assert want[0]["losses"][-1] < want[0]["losses"][0]
    assert got[0]["params"].keys() == want[0]["params"].keys()
    for name, value in want[0]["params"].items():
        diff = (torch.tensor(got[0]["params"][name]) - torch.tensor(value)).abs().max().item()
        assert diff <= 1e-5, f"{name}: {diff}"


def test_save_state_resumes_exactly_and_save_model_loads_with_from_pretrained(scratch):
    """save_state after 2 of 5 steps at stage 3 (the engine's sharded checkpoint inside
    accelerate's folder with the scheduler, sampler and RNG states); load_state and
    skip_first_batches give the uninterrupted run's last losses and parameters bit for bit.
    save_model's safetensors load with from_pretrained as the engine's whole parameters."""
    config = {"zero_optimization": {"stage": 3}, "gradient_clipping": 1.0}
    state = str(scratch / "state")
    whole = run_ranks(
        [WORKER, "zs", str(STEPS), str(scratch / "whole"), json.dumps(config)], WORLD,
        str(scratch / "whole"), timeout=600, extra_env={"ZS_ACCELERATE_SAVE": state})
    assert sorted(os.listdir(state))[:3] == ["latest", "random_states_0.pkl", "random_states_1.pkl"]
    assert os.path.isdir(os.path.join(state, "zeroshard"))
    assert whole[0]["from_pretrained_diff"] == 0.0
    resumed = run_ranks([WORKER, "zs", str(STEPS), str(scratch / "resumed"), json.dumps(config)],
                        WORLD, str(scratch / "resumed"), timeout=600,
                        extra_env={"ZS_ACCELERATE_LOAD": state})
    for rank in range(WORLD):
        assert resumed[rank]["losses"] == whole[rank]["losses"][4:]
        assert resumed[rank]["params"] == whole[rank]["params"]


def test_a_window_accelerate_ends_early_is_refused_not_stepped_apart(scratch):
    """11 micro-batches a rank with accumulation 2: accelerate ends a window at the data
    loader's end, which the engine cannot; every rank stops there, saying so."""
    out = str(scratch / "odd")
    ranks = run_ranks([WORKER, "zs", "6", out, json.dumps({"gradient_clipping": 1.0})],
                      WORLD, out, timeout=600, extra_env={"ZS_ACCELERATE_ROWS": "44"},
                      expect_ok=False)
    for code, log in ranks:
        assert code != 0, log
        assert ("accelerate ends the accumulation window at this micro-batch and the engine "
                "does not (every 2 micro-batches)") in log, log


def test_context_parallelism_of_a_parallelism_config_trains_as_accelerates_fsdp2_path(scratch):
    """accelerate_cp_script.py on 4 ranks: ParallelismConfig(dp_shard_size=2, cp_size=2) and
    accelerate's ND-parallel loop (maybe_context_parallel, the model's own loss) with
    zeroshard's Accelerator at ZeRO 3 = FSDP2 over accelerate's dp_shard_cp mesh with torch's
    context_parallel: each rank's loss (its slice's mean), the gradient norms and the
    parameters after 4 steps within 1e-5. FSDP2 averages the gradients over all 4 ranks, the
    engine sums a cp group's: without the Accelerator's division by cp the norms double."""
    out = scratch / "cp"
    ranks = run_ranks([os.path.join(HERE, "accelerate_cp_script.py"), str(out)], 4, out)
    for rank in ranks:
        assert (rank["dp_world_size"], rank["seq_dp_world_size"]) == (2, 4)
        assert len(rank["losses"]) == 4
        got_want = zip(rank["losses"] + rank["norms"], rank["ref_losses"] + rank["ref_norms"])
        for got, want in got_want:
            assert abs(got - want) < 1e-5, (got, want)
        assert rank["max_param_diff"] < 1e-5, rank["max_param_diff"]
    # A cp group's ranks drew the same samples and held torch's head-tail slices of them.
    assert ranks[0]["firsts"] == ranks[1]["firsts"] != ranks[2]["firsts"] == ranks[3]["firsts"]
    assert ranks[0]["positions"][0] == [0, 1, 2, 3, 12, 13, 14, 15]
    assert ranks[1]["positions"][0] == list(range(4, 12))


def test_deepspeed_sequence_parallelism_of_a_parallelism_config_trains_as_whole_sequences(
        scratch):
    """accelerate_sp_script.py on 4 ranks: ALST's loop as accelerate's guide writes it, with
    ParallelismConfig(sp_backend='deepspeed', sp_size=2) (SP=2 x DP=2) and zeroshard's
    Accelerator at ZeRO 3: each step's loss is its group's sample's whole-sequence loss, and
    gradient norms and parameters after 4 steps are one process's on both groups' samples."""
    out = scratch / "sp"
    ranks = run_ranks([os.path.join(HERE, "accelerate_sp_script.py"), str(out)], 4, out)
    for rank_number, rank in enumerate(ranks):
        assert (rank["dp_world_size"], rank["sequence_parallel_size"]) == (2, 2)
        assert len(rank["losses"]) == 4
        for got, want in zip(rank["losses"], rank["ref_losses"]):
            assert abs(got - want[rank_number // 2]) < 1e-5, (got, want)
        for got, want in zip(rank["norms"], rank["ref_norms"]):
            assert abs(got - want) < 1e-5, (got, want)
        assert rank["max_param_diff"] < 1e-5, rank["max_param_diff"]


def test_what_accelerate_would_shard_itself_or_drop_is_refused_by_name():
    code, out = run_snippet(
        "from zeroshard.integrations import Accelerator\n"
        "from accelerate.utils import FullyShardedDataParallelPlugin\n"
        "Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())\n")
    assert code != 0
    assert "zeroshard Accelerator: fsdp_plugin is given; zeroshard does the sharding here" in out, out
    code, out = run_snippet(
        "from zeroshard.integrations import Accelerator\n"
        "from accelerate import ParallelismConfig\n"
        "Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2, cp_size=2))\n")
    assert code != 0
    assert ("zeroshard Accelerator: parallelism_config (tp_size=2, cp_size=2): zeroshard "
            "shards over the data-parallel ranks itself") in out, out
    code, out = run_snippet(
        "from zeroshard.integrations import Accelerator\n"
        "from accelerate import ParallelismConfig\n"
        "Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2))\n")
    assert code != 0
    assert ("zeroshard Accelerator: parallelism_config: dp_replicate_size x dp_shard_size x "
            "cp_size = 4, over 1 ranks; allowed: sizes whose product is the world size 1") \
        in out, out
    code, out = run_snippet(
        "from zeroshard.integrations import Accelerator\n"
        "a = Accelerator(cpu=True, zeroshard_config={'gradient_clipping': 0.5})\n"
        "m, o = a.prepare(model, torch.optim.AdamW(model.parameters()))\n"
        "a.clip_grad_norm_(m.parameters(), 1.0)\n")
    assert code != 0
    assert ("clip_grad_norm_(max_norm=1.0, norm_type=2): the engine clips the global 2-norm at "
            "its step to the config's gradient_clipping (0.5)") in out, out
