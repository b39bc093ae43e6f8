"""Pipeline parallelism composed with ZeRO on 4 real ranks (PP2 x DP2, Gloo), and with tensor
parallelism on 8 (PP2 x TP2 x DP2, the stages from a Megatron mpu): a small GPT split
in two stages (tests/python/pp_worker.py), each stage's module given to zeroshard.initialize
with pipeline.stages 2 and run by torch's ScheduleGPipe or Schedule1F1B through
zeroshard.pipelining.PipelineStage, 8 micro-batches a step, at stages 1 to 3 and 3 with the
optimizer on the CPU, gradient clipping active: every step's loss (mean over the last stage's
micro-batches and the data-parallel ranks), the pre-clip gradient norm over both stages, and
every parameter at the end equal the whole model's in one process with torch's AdamW on the
same global batch. What the stage cannot do is refused by name before a step is taken."""
import importlib.util
import inspect
import json
import os

import pytest
import torch

from conftest import HERE, both_legs, main_leg_only, run_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.pipelining") is None,
    reason="torch.distributed.pipelining is not in this torch")

WORKER = os.path.join(HERE, "pp_worker.py")
WORLD, DP, STEPS = 4, 2, 4
_reference = {}


def reference(scratch):
    if "ref" not in _reference:
        out = str(scratch / "ref")
        _reference["ref"] = run_ranks([WORKER, "ref", str(STEPS), out], 1, out)[0]
    return _reference["ref"]


_runs = {}


def train(schedule, zero, scratch, tp=1, extra=None):
    key = (schedule, json.dumps(zero, sort_keys=True), tp, json.dumps(extra))
    if key not in _runs:
        out = str(scratch / schedule)
        zero = dict(zero)
        keep = {"keep_gathered": zero.pop("keep_gathered")} if "keep_gathered" in zero else {}
        config = json.dumps(dict({"zero_optimization": zero}, **keep, **(extra or {})))
        _runs[key] = run_ranks([WORKER, schedule, str(STEPS), out, config, str(tp)],
                               WORLD * tp, out)
    return _runs[key]


def joined(got, tp, key="params"):
    """Each stage's whole parameters from its data-parallel rank 0's tp slices (the first tp
    ranks of the stage), the way tests/python/test_tensor_parallel.py joins them."""
    params, per_stage = {}, len(got) // 2
    for first in (0, per_stage):
        ranks = got[first:first + tp]
        for name, value in ranks[0][key].items():
            if name in ranks[0]["split"]:
                parts = [torch.tensor(r[key][name]) for r in ranks]
                params[name] = torch.cat(parts, dim=ranks[0]["split"][name])
            else:
                params[name] = torch.tensor(value)
    return params


def assert_as_one_process(got, want, tp=1):
    for r in got:
        assert (r["dp_world_size"], r["mp_world_size"], r["train_batch_size"]) == (DP, tp, 32)
    last = [r for r in got if r["losses"]]  # the last stage's ranks
    assert len(last) == len(got) // 2
    for step in range(STEPS):  # the tp ranks of a data-parallel rank share its batch
        loss = sum(r["losses"][step] for r in last) / len(last)
        assert abs(loss - want["losses"][step]) <= 1e-5 * abs(want["losses"][step]), step
        for r in got:  # every rank of both stages clipped by the whole model's norm
            assert abs(r["norms"][step] - want["norms"][step]) <= 1e-5 * want["norms"][step]
    assert min(want["norms"]) > 0.05, "clipping was not active"
    assert_params_close(joined(got, tp), want["params"])


def assert_params_close(params, want):
    """Every parameter within 1e-5 of the one-process model's (relative to its largest
    value where that is above 1)."""
    assert params.keys() == want.keys()
    for name, value in want.items():
        value = torch.tensor(value)
        diff = (params[name] - value).abs().max().item()
        assert diff <= 1e-5 * max(1.0, value.abs().max().item()), f"{name}: {diff}"


# Stage 3: a stage's units stay gathered from their first use in a step to its optimizer
# step, across the micro-batches (PipelineStage's keep_gathered); without, each is gathered
# again for each micro-batch's forward and backward.
# Persistence threshold 0: no unit is kept for being small (every block here is).
KEEP = {"stage": 3, "stage3_param_persistence_threshold": 0}
REGATHER = dict(KEEP, keep_gathered=False)


def in_this_torch(schedule_class):
    """Skipped where this torch has no such schedule (ScheduleDualPipeV came after 2.6)."""
    try:
        import torch.distributed.pipelining as pipelining
    except ImportError:
        pipelining = None
    return pytest.mark.skipif(not hasattr(pipelining, schedule_class),
                              reason=f"torch {torch.__version__} has no {schedule_class}")


# torch 2.6's V schedules hand a stage's output to the next stage on the same rank by a send
# to itself, which Gloo cannot make ("Bad file descriptor"); later torches hand it over in
# memory.
V_OVER_GLOO = pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 11),
                                 reason="torch 2.6's V schedules send to the same rank")
ZERO_BUBBLE = ("zerobubble", "zbv", "dualpipev")


@pytest.mark.parametrize("schedule,zero", [
    both_legs("interleaved", {"stage": 1}), ("interleaved", KEEP), ("looped", {"stage": 2}),
    both_legs("zerobubble", KEEP), pytest.param("zbv", {"stage": 2}, marks=V_OVER_GLOO),
    pytest.param("zbv", REGATHER, marks=V_OVER_GLOO),
    pytest.param("dualpipev", {"stage": 1}, marks=in_this_torch("ScheduleDualPipeV"))])
def test_several_stages_on_each_rank_train_as_the_whole_model(schedule, zero, scratch):
    """Interleaved schedules: 4 stages of one block on 2 ranks' stages (stages 0 and 2 on
    the first, 1 and 3 on the second; in a V, 0 and 3 then 1 and 2), each rank's two one
    engine's nn.ModuleList, run by ScheduleInterleaved1F1B, ScheduleLoopedBFS and the
    zero-bubble ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble and ScheduleDualPipeV;
    the engine counts a micro-batch at the last of its stages' backwards (under zero-bubble
    schedules at their weight halves), and reduces once after the step's last."""
    got = train(schedule, zero, scratch)
    assert_as_one_process(got, reference(scratch))
    # Every stage but the first splits its backward (the first has no input gradient to
    # hurry): 3 stages x 2 data-parallel ranks x 4 steps x 8 micro-batches; DualPipeV those
    # of its warm-up and cool-down only (the rest overlap a forward with a whole backward).
    halves = sum(r["input_halves"] for r in got)
    if schedule in ("zerobubble", "zbv"):
        assert halves == 3 * 2 * STEPS * 8, halves
    assert (halves > 0) == (schedule in ZERO_BUBBLE), halves


# The oldest torch (2.6) runs a case of each schedule.
@pytest.mark.parametrize("schedule,zero", [
    both_legs("gpipe", {"stage": 1}), ("1f1b", {"stage": 1}), ("gpipe", {"stage": 2}),
    ("1f1b", {"stage": 2}), ("gpipe", {"stage": 3}), both_legs("1f1b", {"stage": 3}),
    ("gpipe", KEEP), ("1f1b", KEEP), ("gpipe", REGATHER), ("1f1b", REGATHER),
    ("1f1b", {"stage": 3, "offload_optimizer": {"device": "cpu"}})])
def test_pp2_dp2_trains_as_the_whole_model_in_one_process(schedule, zero, scratch):
    assert_as_one_process(train(schedule, zero, scratch), reference(scratch))


@main_leg_only
def test_sends_and_receives_through_host_copies_train_as_the_whole_model(scratch):
    """A GPU stage over Gloo (ranks sharing one GPU) sends and receives through host
    copies, each received one landed in the stage's buffer before the stage reads it
    (_parallel/pipelining.py _through_host); ZS_PIPELINE_VIA_HOST=1 takes that path on the
    CPU. Forward activations, input gradients and the zero-bubble schedule's split backward
    all cross that way: a copy never landed leaves a buffer's garbage in the losses."""
    out = str(scratch / "via-host")
    got = run_ranks([WORKER, "zerobubble", str(STEPS), out,
                     json.dumps({"zero_optimization": {"stage": 1}}), "1"], WORLD, out,
                    extra_env={"ZS_PIPELINE_VIA_HOST": "1"})
    assert_as_one_process(got, reference(scratch))


@pytest.mark.parametrize("schedule,zero",
                         [("1f1b", {"stage": 1}), both_legs("gpipe", {"stage": 3})])
def test_pp2_tp2_dp2_through_a_megatron_mpu_trains_as_the_whole_model(schedule, zero, scratch):
    """8 ranks: the blocks split Megatron-style, the stages and groups from an mpu."""
    assert_as_one_process(train(schedule, zero, scratch, tp=2), reference(scratch), tp=2)


@pytest.mark.parametrize("schedule", [both_legs("gpipe"), "1f1b"])
def test_stage3_units_kept_across_micro_batches_send_less(schedule, scratch):
    kept = train(schedule, KEEP, scratch)
    regathered = train(schedule, REGATHER, scratch)
    for k, r in zip(kept, regathered):
        # 8 micro-batches: forward and backward gathers 8 times over against once
        assert r["bytes_sent"] > 2 * k["bytes_sent"], (r["bytes_sent"], k["bytes_sent"])
        # Kept: the stage's whole parameters gathered at the peak, as the plan counts them
        # (within the shards' padding).
        peak, planned = k["memory"]["gathered_params"]
        assert abs(peak - planned) <= 0.02 * planned, (peak, planned)


@pytest.mark.parametrize("schedule,zero", [("1f1b", {"stage": 2}), both_legs("gpipe", KEEP)])
def test_stages_2_and_3_reduce_once_a_step(schedule, zero, scratch):
    """PipelineStage's reduce_once (the default): the gradients are reduced once, after the
    last of the 8 micro-batches, the whole gradient buffer held until then (the ledger's
    peak as the plan counts it); reduce_once=False reduce-scatters each micro-batch's. The
    same numbers either way (the default runs in the test above)."""
    once = train(schedule, zero, scratch)
    each = train(schedule, zero, scratch, extra={"reduce_once": False})
    assert_as_one_process(each, reference(scratch))
    for o, e in zip(once, each):
        assert o["losses"] == e["losses"] or all(
            abs(a - b) <= 1e-6 * abs(b) for a, b in zip(o["losses"], e["losses"])), (o, e)
        assert e["bytes_sent"] > o["bytes_sent"], (e["bytes_sent"], o["bytes_sent"])
        peak, planned = o["memory"]["grads"]
        assert 0 < peak <= planned <= 1.02 * peak, (peak, planned)
        assert e["memory"]["grads"][1] == 0, e["memory"]  # released after each reduction
    print(f"{schedule} stage {zero['stage']}: a rank sends {once[0]['bytes_sent']} bytes in "
          f"{STEPS} steps reducing once a step, {each[0]['bytes_sent']} each micro-batch")


@pytest.mark.parametrize("schedule,zero", [("1f1b", {"stage": 3}), both_legs("gpipe", {"stage": 1})])
def test_a_checkpoint_of_the_stages_resumes_bit_exactly(schedule, zero, scratch):
    """PP2 x DP2 saved after 2 of 4 steps, each stage its own part of DIR/TAG
    (pipeline_stage_00, _01; pipeline.json): 4 new ranks that load it make the last 2 steps'
    losses, norms and parameters bit for bit; 2 ranks (one per stage) load it as saved."""
    whole = train(schedule, zero, scratch)
    ckpt = str(scratch / "ckpt")
    saving = train(schedule, zero, scratch, extra={"checkpoint": ckpt, "save_at": 2})
    resumed = train(schedule, zero, scratch,
                    extra={"checkpoint": ckpt, "save_at": 2, "resume": True})
    assert sorted(os.listdir(os.path.join(ckpt, "global_step2"))) == [
        "pipeline.json", "pipeline_stage_00", "pipeline_stage_01"]
    for full, saved, again in zip(whole, saving, resumed):
        assert saved["losses"] == full["losses"] and saved["norms"] == full["norms"]
        assert again["losses"] == full["losses"][2:] and again["norms"] == full["norms"][2:]
        assert again["params"] == full["params"]
    # One state_dict of a stage's parameters at the save, as that stage's engine held them;
    # both stages together refused here, as each stage module names its blocks from 0.
    import pp_worker
    from zeroshard import consolidate
    for stage, rank in ((0, 0), (1, WORLD // 2)):
        out = str(scratch / f"stage{stage}.pt")
        consolidate(ckpt, out, stage=stage)
        state = torch.load(out)
        want = saving[rank]["params_at_save"]
        assert {pp_worker.whole_name(stage, n): t.tolist() for n, t in state.items()} == want
    with pytest.raises(ValueError, match=r"pipeline stages 0 and 1 both hold 'blocks\.0\."):
        consolidate(ckpt, str(scratch / "both.pt"))
    # Loaded at another data-parallel size inside each stage (PP2 x DP1, 2 ranks): each
    # stage's parameters as saved, and the first step's loss, on data-parallel rank 0's
    # batch alone, that rank's in the run that went on.
    out = str(scratch / f"dp1{schedule}")
    config = json.dumps({"zero_optimization": zero, "checkpoint": ckpt, "save_at": 2,
                         "resume": True})
    narrower = run_ranks([WORKER, schedule, "3", out, config], 2, out)
    for stage, (rank, saved_rank) in enumerate(((0, 0), (1, WORLD // 2))):
        assert narrower[rank]["params_at_load"] == saving[saved_rank]["params_at_save"]
        assert narrower[rank]["dp_world_size"] == 1
    first, want = narrower[1]["losses"][0], whole[WORLD // 2]["losses"][2]
    assert abs(first - want) <= 1e-6 * abs(want), (first, want)


def test_stages_split_by_torchs_tracer_train_and_consolidate_as_the_whole_model(scratch):
    """torch's tracer front-end (pipeline(model, mb_args, split_spec), a SplitPoint before
    the third block): each rank's stage module, a GraphModule, given to initialize and run
    by Schedule1F1B at stage 3, trains as the whole model; the stages keep the whole
    model's names, so a checkpoint of both consolidates to the whole model's state_dict."""
    ckpt = str(scratch / "ckpt-traced")
    got = train("traced", {"stage": 3}, scratch, extra={"checkpoint": ckpt, "save_at": STEPS})
    want = reference(scratch)
    assert_as_one_process(got, want)
    from zeroshard import consolidate
    out = str(scratch / "traced.pt")
    consolidate(ckpt, out)
    state = torch.load(out)
    assert_params_close(state, want["params"])
    held = {**got[0]["params_at_save"], **got[WORLD // 2]["params_at_save"]}
    assert {n: t.tolist() for n, t in state.items()} == held


@main_leg_only
def test_a_checkpoint_of_stages_with_tensor_parallelism_resumes_bit_exactly(scratch):
    """PP2 x TP2 x DP2 (8 ranks, the groups from an mpu) saved after 2 of 4 steps: each
    stage's folder a tensor-parallel checkpoint of its own (tp_rank_00, tp_rank_01 and
    tensor_parallel.json in pipeline_stage_XX); 8 new ranks that load it make the last 2
    steps bit for bit, and consolidate(stage=) gives each stage's whole tensors, its tp
    slices joined, as the run held them."""
    zero, tp = {"stage": 1}, 2
    schedule = "1f1b"
    whole = train(schedule, zero, scratch, tp=tp)
    ckpt = str(scratch / "ckpt-tp")
    saving = train(schedule, zero, scratch, tp=tp, extra={"checkpoint": ckpt, "save_at": 2})
    resumed = train(schedule, zero, scratch, tp=tp,
                    extra={"checkpoint": ckpt, "save_at": 2, "resume": True})
    folder = os.path.join(ckpt, "global_step2")
    assert sorted(os.listdir(folder)) == ["pipeline.json", "pipeline_stage_00",
                                          "pipeline_stage_01"]
    for stage in ("pipeline_stage_00", "pipeline_stage_01"):
        assert sorted(os.listdir(os.path.join(folder, stage))) == [
            "tensor_parallel.json", "tp_rank_00", "tp_rank_01"]
    for full, saved, again in zip(whole, saving, resumed):
        assert saved["losses"] == full["losses"] and saved["norms"] == full["norms"]
        assert again["losses"] == full["losses"][2:] and again["norms"] == full["norms"][2:]
        assert again["params"] == full["params"]
    import pp_worker
    from zeroshard import consolidate
    want = joined(saving, tp, key="params_at_save")
    for stage in (0, 1):
        out = str(scratch / f"tp-stage{stage}.pt")
        consolidate(ckpt, out, stage=stage)
        for name, t in torch.load(out).items():
            assert torch.equal(t, want[pp_worker.whole_name(stage, name)]), name


@pytest.mark.parametrize("schedule", [both_legs("gpipe"), both_legs("zerobubble")])
def test_fp16_overflow_and_loss_scale_are_agreed_across_the_stages(schedule, scratch):
    """The last stage scales the loss; every stage unscales by its own scaler, so the scalers
    must move together: an overflow anywhere skips the step on every rank of both stages."""
    # Each micro-batch's gradients reduced into fp32 (reduce_once=False): summed once a step
    # in the fp16 buffer instead, the micro-batches at 2^15 overflow again (as at stage 1).
    fp16 = {"fp16": {"enabled": True, "initial_scale_power": 16, "hysteresis": 1},
            "reduce_once": False}
    got = train(schedule, {"stage": 2}, scratch, extra=fp16)
    for r in got:  # 2^16 overflows fp16 at the first step; 2^15 does not
        assert (r["skipped_steps"], r["loss_scale"], r["norms"][0]) == (1, 2.0 ** 15, 0.0)
        assert r["norms"] == got[0]["norms"]  # one norm, summed across the stages
    assert all(n > 0 for n in got[0]["norms"][1:]), "the steps after the overflow were taken"
    if schedule == "zerobubble":  # split backward: the scale goes in at the input half
        gpipe = train("gpipe", {"stage": 2}, scratch, extra=fp16)[0]["norms"]
        for n, want in zip(got[0]["norms"], gpipe):
            assert abs(n - want) <= 1e-5 * want, (got[0]["norms"], gpipe)


REFUSALS = """
import torch, zeroshard
from torch.distributed.pipelining import ScheduleGPipe
from zeroshard.pipelining import PipelineStage
model = torch.nn.Linear(4, 4)
config = {{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
          "pipeline": {{"stages": {stages}}}, "zero_optimization": {{"stage": 1}},
          "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}}}}
engine, _, _, _ = zeroshard.initialize(model=model, config=config)
{body}
"""


def refusal(scratch, body, stages=2, world=2):
    """Every rank's output joined, each having exited non-zero."""
    script = scratch / f"refused{len(list(scratch.iterdir()))}.py"
    script.write_text(REFUSALS.format(stages=stages, body=body))
    ran = run_ranks([str(script)], world, str(scratch / "out"), expect_ok=False, timeout=120)
    assert all(code != 0 for code, _ in ran), ran
    return "\n".join(log for _, log in ran)


@main_leg_only
def test_what_the_stage_cannot_do_is_refused_by_name(scratch):
    # Micro-batches other than the accumulation window, before any micro-batch runs.
    log = refusal(scratch, "stage = PipelineStage(engine)\n"
                  "schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=torch.nn.MSELoss())\n"
                  "x = torch.zeros(4, 4)\n"
                  "schedule.step(x) if stage.is_first else schedule.step(target=x)")
    assert ("the schedule's n_microbatches is 4 but the config's gradient_accumulation_steps "
            "is 2; allowed: equal") in log
    # A schedule that sums the micro-batches' gradients (scale_grads=False; torch 2.6's
    # schedules have no such argument and always average).
    from torch.distributed.pipelining import ScheduleGPipe
    if "scale_grads" in inspect.signature(ScheduleGPipe.__init__).parameters:
        log = refusal(scratch, "stage = PipelineStage(engine)\n"
                      "schedule = ScheduleGPipe(stage, n_microbatches=2, scale_grads=False,\n"
                      "                         loss_fn=torch.nn.MSELoss())\n"
                      "x = torch.zeros(2, 4)\n"
                      "schedule.step(x) if stage.is_first else schedule.step(target=x)")
        assert "a schedule built with scale_grads=False sums them; allowed: scale_grads=True" in log
    log = refusal(scratch, "PipelineStage(engine, num_stages=3)")
    assert ("num_stages=3 over the engine's pipeline.stages 2; allowed: 2 (one stage per rank) "
            "or a multiple of it") in log
    # Several stages on a rank: each a part of the engine's module, named by its index.
    log = refusal(scratch, "PipelineStage(engine, num_stages=4)")
    assert "num_stages=4: 2 stages on each rank, each a part of the engine's module; " \
        "allowed: submodule= that part" in log
    log = refusal(scratch, "PipelineStage(engine, dw_builder=lambda: lambda: None)")
    assert "dw_builder: a weight backward of one's own is not supported" in log
    log = refusal(scratch, "PipelineStage(engine, stage_index=5)")
    assert "stage_index=5 on a rank of pipeline stage 0 (rank // (world / pipeline.stages)); " \
        "allowed: 0 (stage s runs on the ranks of stage s % 2" in log
    log = refusal(scratch, (
        "import os\n"
        "parts = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])\n"
        "engine, _, _, _ = zeroshard.initialize(model=parts, config=config)\n"
        "mine = int(os.environ['RANK'])\n"
        "try:\n"
        "    PipelineStage(engine, stage_index=mine + 1, num_stages=4, submodule=parts[0])\n"
        "except zeroshard.Error as e:\n"
        "    print(e)\n"
        "stage = PipelineStage(engine, stage_index=mine, num_stages=4, submodule=parts[0])\n"
        "schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=torch.nn.MSELoss())\n"
        "x = torch.zeros(2, 4)\n"
        "schedule.step(x) if stage.is_first else schedule.step(target=x)"))
    assert "stage_index=1 on a rank of pipeline stage 0 (rank // (world / pipeline.stages)); " \
        "allowed: 0, 2 (stage s runs on the ranks of stage s % 2" in log
    assert "or 0, 3 (the V of ScheduleZBVZeroBubble and ScheduleDualPipeV)" in log
    assert "this rank holds 2 of the 4 stages but built PipelineStages [0]; allowed: one " \
        "PipelineStage for each part" in log
    # Stages in a V given to a looped schedule: refused before a send goes astray.
    log = refusal(scratch, (
        "import os\n"
        "from torch.distributed.pipelining import ScheduleInterleaved1F1B\n"
        "parts = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])\n"
        "engine, _, _, _ = zeroshard.initialize(model=parts, config=config)\n"
        "mine = int(os.environ['RANK'])\n"
        "stages = [PipelineStage(engine, stage_index=s, num_stages=4, submodule=p)\n"
        "          for s, p in zip((mine, 3 - mine), parts)]\n"
        "schedule = ScheduleInterleaved1F1B(stages, n_microbatches=2,\n"
        "                                   loss_fn=torch.nn.MSELoss())\n"
        "x = torch.zeros(2, 4)\n"
        "schedule.step(x) if mine == 0 else schedule.step(target=x)"))
    assert "the schedule runs stages [0, 2] on this rank but its PipelineStages are [0, 3]" \
        in log, log
    log = refusal(scratch, "PipelineStage(engine)", stages=1, world=1)
    assert "the engine was built with pipeline.stages 1; allowed: the number of stages" in log
    # Stages given different configs (each would agree within itself).
    different = scratch / "different.py"
    different.write_text(REFUSALS.format(stages=2, body="").replace(
        "engine, _, _, _ = zeroshard.initialize(",
        "import os\nif os.environ['RANK'] == '1': config['gradient_clipping'] = 1.0\n"
        "engine, _, _, _ = zeroshard.initialize("))
    ran = run_ranks([str(different)], 2, str(scratch / "different"), expect_ok=False, timeout=120)
    assert all(code != 0 for code, _ in ran), ran
    for _, log in ran:
        assert "the ranks did not build the same engine" in log, log
        assert "rank(s) 1 differ from rank 0" in log and "gradient_clipping" in log, log
        assert "config (as given to each pipeline stage)" in log, log
    # A checkpoint of 2 stages where the engine is one of 1.
    saved = scratch / "two_stages"
    script = scratch / "save_two_stages.py"
    script.write_text(REFUSALS.format(stages=2, body=f"engine.save_checkpoint({str(saved)!r})"))
    run_ranks([str(script)], 2, str(scratch / "saved"), expect_ok=False, timeout=120)
    assert sorted(os.listdir(saved / "global_step0")) == [
        "pipeline.json", "pipeline_stage_00", "pipeline_stage_01"]
    # One stage's part gone: that stage names it, the other hears of it instead of waiting.
    manifest = saved / "global_step0" / "pipeline_stage_01" / "manifest.json"
    kept = manifest.read_text()
    manifest.unlink()
    script = scratch / "load_two_stages.py"
    script.write_text(REFUSALS.format(stages=2, body=f"engine.load_checkpoint({str(saved)!r})"))
    ran = run_ranks([str(script)], 2, str(scratch / "loaded"), expect_ok=False, timeout=120)
    assert all(code != 0 for code, _ in ran), ran
    assert "failed on another rank (its message says why)" in ran[0][1], ran[0][1]
    assert "manifest.json" in ran[1][1], ran[1][1]
    manifest.write_text(kept)
    log = refusal(scratch, f"engine.load_checkpoint({str(saved)!r})", stages=1, world=1)
    # Read by another split, the stages' parts are one checkpoint: these stage modules name
    # their parameters alike ('weight', 'bias' on both), so only their own split loads them.
    assert (f"checkpoint '{saved}/global_step0': pipeline stages 0 and 1 both hold 'weight' "
            "(each stage's module names its own parameters); it loads only at the number of "
            "stages it was saved with") in log, log
    log = refusal(scratch, "", stages=3, world=2)
    assert "pipeline.stages 3 does not divide the 2 ranks" in log
