"""activation_checkpointing.offload: the engine's blocks' saved activations kept in host RAM
(device cpu) or on NVMe (device nvme) from forward to backward. On 2 ranks at stages 2 and 3,
each policy with offload trains to the losses and gradient norms of no offload (bit-equal),
a GPT-2 too at stage 3; what the ledger holds on the host and NVMe tiers after a forward is
memory_report's prediction (the estimator's) within 1% at two sequence lengths, and after
backward only the store's pool of host buffers, which a step as long as the last takes
whole; the forward leaves on the device what it leaves without offload less those bytes;
the swap file grows no further than the most held at once and is removed with the engine.
The estimator's tiers are derived from its own figures for the model without offload;
refusals by their messages."""
import json
import os
import subprocess

import pytest

from conftest import BUILD, HERE, run_ranks
from test_activation_memory import BATCH, SEQ
import test_activation_policy

pytestmark = test_activation_policy.pytestmark  # the same skip: transformers' absence

LAYERS = 4
OFFLOADS = {
    "none": {"mode": "none"},
    "cpu": {"mode": "none", "offload": {"device": "cpu"}},
    "full cpu": {"mode": "full", "offload": {"device": "cpu"}},
    "selective-2 cpu": {"mode": "selective", "selective_ac_option": 2,
                        "offload": {"device": "cpu"}},
    "nvme": {"mode": "none", "offload": {"device": "nvme"}},
    "full nvme": {"mode": "full", "offload": {"device": "nvme"}},
    "auto cpu": {"mode": "auto", "offload": {"device": "cpu"}},  # recomputes none here
}
# A GPT-2 too, at stage 3: the policies without offload and with it on each tier.
GPT_RUNS = {"none": OFFLOADS["none"], "full": {"mode": "full"},
            "op": {"mode": "selective", "selective_ac_option": "op"},
            **{name: OFFLOADS[name] for name in ("cpu", "full cpu", "full nvme")}}


def flags(keys):
    out = ["--ac-mode", keys["mode"]]
    if "selective_ac_option" in keys:
        out += ["--ac-option", str(keys["selective_ac_option"])]
    if "offload" in keys:
        out += ["--ac-offload", keys["offload"]["device"]]
    return out


def estimated(config, scratch, *args):
    """zeroshard-estimate's activations on each tier, {tier: bytes}."""
    path = scratch / "config.json"
    config.to_json_file(str(path))
    out = subprocess.run(
        [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config", str(path),
         "--micro-batch", str(BATCH), "--bf16", "--json", *args,
         *([] if "--seq" in args else ["--seq", str(SEQ)])],
        capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    kinds = json.loads(out.stdout)["options"][0]["bytes_by_kind"]
    return {tier: kinds[tier].get("activations", 0) for tier in ("device", "host", "nvme")}


def test_estimator_tiers(scratch):
    """Every block's bytes on the offload tier, two blocks' on the device beside the head
    (and one block recomputed under full), two more in host RAM on their way to NVMe; from
    the estimator's own figures for 4 and 3 blocks without offload."""
    from test_activation_policy import layered
    config = layered("llama")
    none = estimated(config, scratch)["device"]
    block = none - estimated(layered("llama", LAYERS - 1), scratch)["device"]
    head = none - LAYERS * block
    kept_input = BATCH * SEQ * config.hidden_size * 2
    assert estimated(config, scratch, *flags(OFFLOADS["cpu"])) == {
        "device": head + 2 * block, "host": LAYERS * block, "nvme": 0}
    assert estimated(config, scratch, *flags(OFFLOADS["nvme"])) == {
        "device": head + 2 * block, "host": 2 * block, "nvme": LAYERS * block}
    assert estimated(config, scratch, *flags(OFFLOADS["full cpu"])) == {
        "device": head + block + 2 * kept_input, "host": LAYERS * kept_input, "nvme": 0}
    tool = os.path.join(BUILD, "tools", "zeroshard-estimate")
    path = scratch / "config.json"
    for args, message in [
            (["--ac-offload", "disk"], "--ac-offload: 'disk' is not allowed; allowed: cpu, "
                                       "nvme or none"),
            (["--ac-mode", "selective", "--ac-offload", "cpu"],
             "'activation_checkpointing.offload.device' is 'cpu' with mode 'selective' and "
             "option op: not composed in zeroshard yet")]:
        out = subprocess.run([tool, "--hf-config", str(path), *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 or out.returncode == 1, out
        assert message in out.stderr, (args, out.stderr)


def test_offloaded_training_is_training_without(scratch):
    assert_offloaded_training_is_training_without(scratch, {})


def assert_offloaded_training_is_training_without(scratch, env):
    """activation_offload_worker.py on 2 ranks (env: tests/python/test_gpu_paths.py's, to
    run it on a GPU), against the module's claims above."""
    from test_activation_policy import layered
    out = scratch / "offload"
    ranks = run_ranks([os.path.join(HERE, "activation_offload_worker.py"), str(out)], 2, out,
                      timeout=600, extra_env=env)
    config = layered("llama")
    for rank in ranks:
        assert rank.pop("swap dirs left") == []  # removed with the engines
        for stage in (2, 3):
            plain = rank[f"none stage {stage}"]
            for name, keys in OFFLOADS.items():
                run = rank[f"{name} stage {stage}"]
                assert run["losses"] == plain["losses"], (name, stage)
                assert run["norms"] == plain["norms"], (name, stage)
                # After backward only the store's pool is held (within the most in use at
                # once); the third step, as long as the second, makes no host buffer anew.
                assert run["after"]["host"] == run.get("pooled", 0), (name, stage, run)
                assert run["after"]["host"] <= run["peak"]["host"], (name, stage)
                assert run["after"]["nvme"] == 0, (name, stage)
                if "offload" in keys:
                    assert run["made"][2] == run["made"][1] > 0, (name, stage, run["made"])
                tier = {"cpu": "host", "nvme": "nvme"}.get(keys.get("offload", {}).get("device"))
                for seq in (SEQ, SEQ // 2):
                    predicted = run[f"predicted {seq}"]
                    assert predicted == estimated(config, scratch, *flags(keys), "--seq",
                                                  str(seq)), (name, seq)
                    if tier is None:
                        continue
                    held = run["held"][str(seq)][tier]
                    assert abs(held - predicted[tier]) <= 0.01 * predicted[tier], \
                        f"{name} stage {stage} seq {seq}: held {held}, planned {predicted[tier]}"
                if tier == "nvme":  # two blocks in host RAM at most on their way
                    staged = run["peak"]["host"]
                    assert abs(staged - run[f"predicted {SEQ}"]["host"]) <= \
                        0.01 * run[f"predicted {SEQ}"]["host"], (name, stage, staged)
                    assert run["file_bytes"] == run["peak"]["nvme"], (name, stage)
        gpt = rank["gpt2 none stage 3"]
        for name, keys in GPT_RUNS.items():
            run = rank[f"gpt2 {name} stage 3"]
            assert (run["losses"], run["norms"]) == (gpt["losses"], gpt["norms"]), name
            recomputes = keys["mode"] != "none"
            assert run["checkpoints"] == (3 * LAYERS if recomputes else 0), (name, run)
            assert (run["host peak"] > 0) == ("offload" in keys), (name, run)
    # The forward leaves on the device what it leaves without offload but the blocks' bytes
    # the plan moves (the head's: the final norm, the logits and the loss's fp32 copy).
    estimate = estimated(config, scratch)["device"]
    block = estimate - estimated(layered("llama", LAYERS - 1), scratch)["device"]
    for rank in ranks:
        left = rank["none stage 2"]["forward_kept"] - LAYERS * block
        for name in ("cpu", "full cpu", "nvme"):
            kept = rank[f"{name} stage 2"]["forward_kept"]
            assert abs(kept - left) <= 0.03 * left, f"{name}: the forward left {kept}, not {left}"


def test_refusals():
    """Each combination not composed, and a missing or stray nvme_path, by its message."""
    import torch
    import zeroshard
    from zeroshard._activations import policy
    from zeroshard._common import config
    cases = [
        ({"offload": {"device": "nvme"}},
         "'activation_checkpointing.offload.nvme_path' is missing; allowed: a directory"),
        ({"offload": {"device": "cpu", "nvme_path": "/x"}},
         "'activation_checkpointing.offload.nvme_path' is '/x' with device 'cpu'; allowed: "
         "device nvme, or leave nvme_path out"),
        ({"mode": "selective", "offload": {"device": "cpu"}},
         "'activation_checkpointing.offload.device' is 'cpu' with mode 'selective' and option "
         "op: not composed in zeroshard yet (the kept op outputs stay in torch's "
         "selective-checkpoint cache)"),
        ({"mode": "memory_budget", "offload": {"device": "nvme", "nvme_path": "/x"}},
         "'activation_checkpointing.offload.device' is 'nvme' with mode 'memory_budget': not "
         "composed in zeroshard yet (the budget counts device bytes before offload)"),
        ({"enabled": True, "offload": {"device": "cpu"}},
         "'activation_checkpointing.offload.device' is 'cpu' with "
         "'activation_checkpointing.enabled' true"),
        ({"offload": {"device": "tape"}}, "allowed: one of none, cpu, nvme"),
    ]
    for keys, message in cases:
        with pytest.raises(zeroshard.Error) as caught:
            zeroshard.load_config({"activation_checkpointing": keys})
        assert message in str(caught.value), (keys, str(caught.value))
    loaded = config.parse({"activation_checkpointing": {"offload": {"device": "cpu"}}})
    with pytest.raises(zeroshard.Error, match=r"activation_checkpointing.offload.device 'cpu' "
                                              r"with 2 pipeline stages: not composed"):
        policy.apply(None, torch.nn.Sequential(torch.nn.Linear(4, 4)), loaded, stages=2)
    with pytest.raises(zeroshard.Error, match=r"activation_checkpointing.offload: the model "
                                              r"\(a Linear\) has no blocks to offload"):
        policy.Recompute(None, torch.nn.Linear(4, 4), "none", "op", 0.5, offload=object())
