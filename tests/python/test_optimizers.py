"""torch.optim's other classes on the shards (optim/ExternalOptimizer.h), on 2 real ranks:
each class, given as the client's object or named in the config's optimizer section,
trains as it does under torch DDP (losses every step and parameters after the last
within 1e-5) at stages 1, 2 (optimizer offloaded to the host) and 3, with its state in
memory and paged through NVMe; a checkpoint saved mid-run resumes bit-identically (NVMe
too); Lamb (DeepSpeed's) and Adafactor (transformers') sum their whole-parameter
statistics across the shards and match one process; DeepSpeed's DeepSpeedCPUAdam, built
by the script, is zeroshard's own Adam; what zeroshard lacks (Adafactor's state on NVMe,
a param the class does not take, a 16-bit DeepSpeedCPUAdam) is refused naming why.
Classes that need whole parameters are refused in test_param_groups.py."""
import json
import os

import pytest
import torch

import models
from conftest import HERE, OLDEST_LEG, run_ranks, run_snippet

WORKER = os.path.join(HERE, "optimizer_worker.py")
STEPS, WORLD = 8, 2
STAGE1 = {"zero_optimization": {"stage": 1}}
STAGE2_CPU = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
STAGE3 = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}

# RMSprop trains at lr 1e-3: at 1e-2 its first steps (g / sqrt(0.01 g^2): +-10 lr even
# where |g| is rounding noise) carry the last-bit difference between two reduction orders
# (ZeRO reduces then scales, DDP scales then reduces) past 1e-5 by step 6; at one rank
# the two runs are bit-identical.
CASES = {
    "Adafactor": {"lr": None, "beta1": 0.9},  # transformers' (resume only; see below)
    "SGD": {"momentum": 0.9, "nesterov": True, "dampening": 0.0},
    "Adagrad": {"lr_decay": 0.01, "initial_accumulator_value": 0.1},
    "RMSprop": {"momentum": 0.5, "centered": True, "lr": 1e-3},
    "Adamax": {},
    "NAdam": {"momentum_decay": 0.004},
    "RAdam": {"decoupled_weight_decay": True},
    "Adam": {"amsgrad": True},
}


def run(scratch, mode, name, runs=None):
    out = str(scratch / f"{mode}-{name}")
    args = [WORKER, mode, name, json.dumps(CASES[name]), str(STEPS), out]
    losses = run_ranks(args + ([json.dumps(runs)] if runs else []), WORLD, out, timeout=600)
    count = len(runs) if runs else 1
    return losses, [torch.load(f"{out}.rank0.{i}.pt") for i in range(count)]


def assert_close(got_losses, got_params, want_losses, want_params, what):
    for rank in range(WORLD):
        for step, (a, b) in enumerate(zip(got_losses[rank], want_losses[rank])):
            assert abs(a - b) <= 1e-5 * abs(b), f"{what}, rank {rank} step {step}: {a} vs {b}"
    start = models.make("gpt").state_dict()
    assert max((want_params[k] - t).abs().max().item() for k, t in start.items()) > 1e-3, \
        f"{what}: DDP's parameters did not move"
    for key, w in want_params.items():
        diff = (got_params[key] - w).abs().max().item()
        assert diff <= 1e-5 * max(w.abs().max().item(), 1e-6), f"{what}: {key} off by {diff}"


def stage3_nvme(scratch):
    """Stage 3 with the state paged through NVMe in sub-groups of 1000 elements: each
    block's shard (2128 elements a rank) is three swap regions, cut inside parameters."""
    return {"zero_optimization": dict(STAGE3["zero_optimization"], sub_group_size=1000,
                                      offload_optimizer={"device": "nvme",
                                                         "nvme_path": str(scratch)})}


@pytest.mark.parametrize("name", sorted(set(CASES) - {"Adafactor"}))
def test_torch_optimizer_on_the_shards_matches_ddp(name, scratch):
    runs = [{"config": STAGE1, "via": "client"},
            {"config": STAGE2_CPU, "via": "config" if name != "Adam" else "client"},
            {"config": STAGE3, "via": "client"},
            {"config": stage3_nvme(scratch), "via": "client"}]
    want_losses, (want_params,) = run(scratch, "ddp", name)
    got, got_params = run(scratch, "zs", name, runs)
    for i, r in enumerate(runs):
        what = f"{name} {r['config']['zero_optimization']} via {r['via']}"
        assert_close([g[i]["losses"] for g in got], got_params[i],
                     [w[0] for w in want_losses], want_params, what)
        # The state the class holds is what the memory model predicted from its probe.
        for rank in range(WORLD):
            held, predicted = got[rank][i]["optimizer_states"]
            assert held == predicted > 0, f"{what}, rank {rank}: {held} vs {predicted}"


RESUMED = {"SGD": ["momentum_buffer"], "Adagrad": ["sum"], "NAdam": ["exp_avg", "exp_avg_sq"],
           "Adafactor": ["exp_avg", "exp_avg_sq"]}


@pytest.mark.parametrize("name", list(RESUMED))
def test_a_torch_optimizer_resumes_bit_identically(name, scratch):
    """Saved after 4 steps at stage 3, loaded by a new engine: the same losses and
    parameters, bit for bit, as without the interruption (the state arrays resharded by
    name, the per-group step counts and NAdam's mu_product restored)."""
    if name == "Adafactor":  # its factored statistics saved by parameter name
        pytest.importorskip("transformers")
    runs = [{"config": STAGE3}, {"config": STAGE3, "resume_at": 4}]
    got, params = run(scratch, "zs", name, runs)
    for rank in range(WORLD):
        assert got[rank][1]["losses"] == got[rank][0]["losses"], f"rank {rank}: {got[rank]}"
    for key, t in params[0].items():
        assert torch.equal(params[1][key], t), key
    manifest = json.load(open(os.path.join(str(scratch / f"zs-{name}.ckpt1"), "global_step4",
                                           "manifest.json")))
    assert manifest["optimizer_state"] == RESUMED[name]


@pytest.mark.parametrize("name", ["Adagrad", "NAdam"])
def test_a_torch_optimizer_resumes_bit_identically_from_nvme(name, scratch):
    """The same with the state paged through NVMe: the regions' arrays are saved and
    written back (Adagrad's sum, which its constructor makes; NAdam's two moments beside
    its mu_product, which stays with the class)."""
    nvme = stage3_nvme(scratch)
    runs = [{"config": nvme}, {"config": nvme, "resume_at": 4}]
    got, params = run(scratch, "zs", name, runs)
    for rank in range(WORLD):
        assert got[rank][1]["losses"] == got[rank][0]["losses"], f"rank {rank}: {got[rank]}"
    for key, t in params[0].items():
        assert torch.equal(params[1][key], t), key


def test_nvme_for_adafactor_and_a_classs_foreign_params_are_refused_by_name():
    pytest.importorskip("transformers")
    code, out = run_snippet(
        "from transformers.optimization import Adafactor\n"
        "try:\n"
        "    zeroshard.initialize(model=model, config={'zero_optimization': {'stage': 2, "
        "'offload_optimizer': {'device': 'nvme', 'nvme_path': '/tmp'}}},\n"
        "                         optimizer=Adafactor(model.parameters(), lr=None))\n"
        "except zeroshard.Error as e:\n"
        "    print('REFUSED', e)\n"
        "try:\n"
        "    zeroshard.initialize(model=model, config={'optimizer': {'type': 'SGD', 'params': "
        "{'lr': 0.1, 'betas': [0.9, 0.99]}}})\n"
        "except zeroshard.Error as e:\n"
        "    print('REFUSED', e)\n")
    assert code == 0, out
    refusals = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert len(refusals) == 2, out
    assert ("'zero_optimization.offload_optimizer.device' is 'nvme' with optimizer Adafactor, "
            "whose update needs every group's whole parameters in one step; allowed: cpu or "
            "none") in refusals[0]
    assert "config key 'optimizer.params'" in refusals[1] and "betas" in refusals[1]
    assert "allowed: " in refusals[1] and "momentum" in refusals[1]


def test_a_torch_optimizers_checkpoint_continues_at_four_ranks(scratch):
    """Adagrad (its sum and per-group step count) saved after 4 steps at 2 ranks, stage 3,
    loaded at 4 ranks, stage 2: 4 more steps end where 8 uninterrupted steps at 2 ranks
    do (the same global batches), within 1e-5."""
    ckpt = str(scratch / "ckpt")
    runs = [{"config": STAGE3}, {"config": STAGE3, "resume_at": 4, "save_to": ckpt}]
    _, (whole, _) = run(scratch, "zs", "Adagrad", runs)
    out = str(scratch / "four")
    load = [{"config": {"zero_optimization": {"stage": 2}}, "load_from": ckpt}]
    run_ranks([WORKER, "zs", "Adagrad", json.dumps(CASES["Adagrad"]), str(STEPS), out,
               json.dumps(load)], 4, out, timeout=600)
    resumed = torch.load(f"{out}.rank0.0.pt")
    for key, w in whole.items():
        diff = (resumed[key] - w).abs().max().item()
        assert diff <= 1e-5 * max(w.abs().max().item(), 1e-6), f"{key} off by {diff}"


WHOLE_PARAMETER = {
    # DeepSpeed's config type: FusedLamb's trust ratio ||w|| / ||u|| per parameter
    "Lamb": ("config", {"max_coeff": 5.0, "min_coeff": 0.02}),
    # transformers' defaults (relative step, parameter scale, no first moment), and the
    # Trainer's optim="adafactor" (its lr, no relative step) with a first moment
    "Adafactor": ("client", {"lr": None}),
    "Adafactor-trainer": ("client", {"scale_parameter": False, "relative_step": False,
                                     "warmup_init": False, "beta1": 0.9}),
}


@pytest.mark.parametrize("case", list(WHOLE_PARAMETER))
def test_whole_parameter_statistics_are_summed_across_the_shards(case, scratch):
    """Lamb's norms and Adafactor's row and column second moments and update RMS are
    statistics of whole parameters, which 2 ranks' shards hold in pieces. At stages 1,
    2 (on the host) and 3 the parameters end where one process training the global batch
    over whole parameters ends (within 1e-5), and the mean of the ranks' losses is its
    loss every step; Adafactor holds the state the memory model predicts."""
    if case.startswith("Adafactor"):
        pytest.importorskip("transformers")
    name, (via, kwargs) = case.split("-")[0], WHOLE_PARAMETER[case]
    out = str(scratch / "reference")
    run_ranks([WORKER, "reference", name, json.dumps(kwargs), str(STEPS), out], 1, out)
    want_losses = json.load(open(f"{out}.rank0.json"))[0]
    want = torch.load(f"{out}.rank0.0.pt")
    runs = [{"config": c, "via": via} for c in (STAGE1, STAGE2_CPU, STAGE3)]
    out = str(scratch / "zs")
    got = run_ranks([WORKER, "zs", name, json.dumps(kwargs), str(STEPS), out, json.dumps(runs)],
                    WORLD, out, timeout=600)
    for i, r in enumerate(runs):
        what = f"{case} {r['config']['zero_optimization']}"
        for step, want_loss in enumerate(want_losses):
            mean = sum(got[rank][i]["losses"][step] for rank in range(WORLD)) / WORLD
            assert abs(mean - want_loss) <= 1e-5 * want_loss, f"{what} step {step}"
        params = torch.load(f"{out}.rank0.{i}.pt")
        for key, w in want.items():
            diff = (params[key] - w).abs().max().item()
            assert diff <= 1e-5 * max(w.abs().max().item(), 1e-6), f"{what}: {key} off by {diff}"
        if name != "Adafactor":
            continue
        # Its state as the memory model predicts it: exp_avg per element (with beta1),
        # each matrix's row and column statistics on every rank, the vectors' exp_avg_sq
        # sharded. Summed over the ranks (which hold different vectors) it is the
        # prediction, less exp_avg of the padding, which no parameter's piece covers.
        held, predicted = (sum(got[r][i]["optimizer_states"][k] for r in range(WORLD))
                           for k in (0, 1))
        assert 0.97 * predicted <= held <= predicted, f"{what}: {held} vs {predicted}"


@pytest.mark.skipif(OLDEST_LEG, reason="DeepSpeed is installed on the main leg only")
@pytest.mark.parametrize("adamw_mode,torch_class", [(True, "AdamW"), (False, "Adam")])
def test_deepspeeds_cpu_adam_from_the_script_is_stepped_as_zeroshards_adam(adamw_mode,
                                                                          torch_class, scratch):
    """DeepSpeedCPUAdam as DeepSpeed-Chat builds it when it offloads (the script's own
    object, passed as optimizer=) trains as torch's AdamW (adamw_mode) or Adam (L2 decay)
    does under DDP, at stage 2 with the optimizer on the host and at stage 3 on the device
    (where DeepSpeedCPUAdam itself cannot step), with zeroshard's Adam doing the steps."""
    kwargs = {"betas": [0.9, 0.95], "eps": 1e-8}
    out = str(scratch / "ddp")
    want_losses = run_ranks([WORKER, "ddp", torch_class, json.dumps(kwargs), str(STEPS), out],
                            WORLD, out, timeout=600)
    want = torch.load(f"{out}.rank0.0.pt")
    runs = [{"config": STAGE2_CPU}, {"config": STAGE3}]
    out = str(scratch / "zs")
    got = run_ranks([WORKER, "zs", "DeepSpeedCPUAdam",
                     json.dumps(dict(kwargs, adamw_mode=adamw_mode)), str(STEPS), out,
                     json.dumps(runs)], WORLD, out, timeout=600)
    for i, r in enumerate(runs):
        assert_close([g[i]["losses"] for g in got], torch.load(f"{out}.rank0.{i}.pt"),
                     [w[0] for w in want_losses], want, f"{torch_class} {r['config']}")
        assert all(g[i]["own_adam"] for g in got)


@pytest.mark.skipif(OLDEST_LEG, reason="DeepSpeed is installed on the main leg only")
def test_what_zeroshards_adam_lacks_of_deepspeeds_cpu_adam_is_refused():
    code, out = run_snippet("""
from deepspeed.ops.adam import DeepSpeedCPUAdam
for kwargs in ({"fp32_optimizer_states": False},):
    try:
        zeroshard.initialize(model=model, config={}, optimizer=DeepSpeedCPUAdam(
            model.parameters(), **kwargs))
    except zeroshard.Error as e:
        print("refused:", e)
""")
    assert code == 0, out
    assert "DeepSpeedCPUAdam(fp32_optimizer_states=False) keeps Adam's moments in 16 bits" in out
