"""activation_checkpointing.mode: the engine recomputing the model's blocks by torchtitan's
policies (full, selective every Nth block or by op, memory_budget) and by auto (the fewest
blocks that fit the device, as the estimator plans them). What a forward keeps
under each is measured with torch's profiler (the bytes the forward allocates and leaves
alive: what backward needs, the logits and the loss) and held to 3% of
zeroshard-estimate --ac-mode's count plus one block recomputed in backward; on 2 ranks
at stages 2 and 3 training gives the losses and gradient norms of the same model without
recompute, the blocks recomputed are those the policy names, and memory_report predicts
the estimator's bytes. Refusals by their messages."""
import copy
import gc
import importlib.util
import json
import os
import subprocess

import pytest

from conftest import BUILD, HERE, run_ranks
from test_activation_memory import BATCH, SEQ, configs, estimated

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed beside this interpreter (the trixie leg): the "
           "main leg runs these tests")

LAYERS = 4
POLICIES = {
    "none": {"mode": "none"},
    "full": {"mode": "full"},
    "selective-2": {"mode": "selective", "selective_ac_option": 2},
    "op": {"mode": "selective", "selective_ac_option": "op"},
    "memory_budget": {"mode": "memory_budget", "memory_budget": 0.85},
    "auto": {"mode": "auto"},
}
# Batches of BATCH sequences told to the auto engines after training, as a forward would
# tell them: the blocks mode auto recomputes for each within this machine's capacity.
LONG = (50_000, 100_000, 150_000, 200_000, 300_000, 400_000, 800_000, 1_600_000)


def flags(keys):
    """zeroshard-estimate's flags for a policy's config keys."""
    names = {"mode": "--ac-mode", "selective_ac_option": "--ac-option",
             "memory_budget": "--memory-budget"}
    return [x for key, value in keys.items() for x in (names[key], str(value))]


def layered(family, layers=LAYERS):
    config = copy.deepcopy(configs()[family])
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):  # Qwen2's, one a layer
        config.layer_types = config.layer_types[:1] * layers
    config.use_cache = False  # GPT-2 keeps each layer's keys and values otherwise
    return config


def measured(config, keys=None):
    """Bytes a bf16 training forward allocates and leaves alive, under the policy `keys`."""
    import torch
    import transformers
    from zeroshard._activations import policy
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()
    if keys and keys["mode"] != "none":
        policy.Recompute(None, model, keys["mode"], str(keys.get("selective_ac_option", "op")),
                         keys.get("memory_budget", 0.5))
    ids = torch.randint(config.vocab_size, (BATCH, SEQ),
                        generator=torch.Generator().manual_seed(1))
    gc.collect()  # nothing made before is freed inside the window
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        out = model(input_ids=ids, labels=ids)
    kept = sum(e.self_cpu_memory_usage for e in prof.key_averages())
    del out
    return kept


@pytest.mark.parametrize("family", ["llama", "llama-eager", "qwen2", "gpt2"])
def test_each_policy_keeps_what_the_estimate_counts(family, scratch):
    config = layered(family)
    none = measured(config)
    block = none - measured(layered(family, LAYERS - 1))
    assert abs(estimated(config, scratch) - none) <= 0.03 * none, (family, none)
    for name in ("full", "selective-2", "op"):
        keys = POLICIES[name]
        kept = measured(config, keys)
        predicted = estimated(config, scratch, *flags(keys))
        assert kept < none, (family, name, kept, none)
        assert abs(predicted - (kept + block)) <= 0.03 * (kept + block), \
            f"{family} {name}: estimated {predicted}, kept {kept} and one block {block}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """activation_policy_worker.py's results on 2 ranks, one per rank."""
    out = tmp_path_factory.mktemp("policy") / "policy"
    return run_ranks([os.path.join(HERE, "activation_policy_worker.py"), str(out)], 2, out)


def test_training_under_each_policy_is_training_without(trained, scratch):
    """2 ranks, stages 2 and 3: every policy's losses and gradient norms are those of mode
    none; a forward runs torch's checkpoint once per block the policy recomputes; the
    engine's prediction is the estimator's; memory_budget recomputes the fewest whole
    blocks that keep the estimate within its fraction of none's, derived here from the
    estimator's own figures for this model and one block fewer."""
    config = layered("llama")
    none = estimated(config, scratch)
    per_block = none - estimated(layered("llama", LAYERS - 1), scratch)
    head = none - LAYERS * per_block
    kept_input = BATCH * SEQ * config.hidden_size * 2
    budget = POLICIES["memory_budget"]["memory_budget"]
    chosen = next(n for n in range(1, LAYERS + 1)
                  if (LAYERS - n) * per_block + n * kept_input + per_block + head <= budget * none)
    recomputed = {"none": 0, "full": LAYERS, "selective-2": LAYERS // 2, "op": LAYERS,
                  "memory_budget": chosen, "auto": 0}
    assert 0 < chosen < LAYERS  # the budget chosen to need some blocks, not all
    for rank in trained:
        for stage in (2, 3):
            plain = rank[f"none stage {stage}"]
            for name, keys in POLICIES.items():
                run = rank[f"{name} stage {stage}"]
                assert run["losses"] == plain["losses"], (name, stage)
                assert run["norms"] == plain["norms"], (name, stage)
                assert run["calls"] == [recomputed[name]] * 3, (name, stage, run["calls"])
                assert run["predicted"] == estimated(config, scratch, *flags(keys)), (name, stage)
            assert rank[f"memory_budget stage {stage}"]["layers"] == [chosen, 0]
            assert rank[f"op stage {stage}"]["layers"] == [0, LAYERS]
            assert rank[f"auto stage {stage}"]["layers"] == [0, 0]


def test_auto_recomputes_what_the_estimator_plans_for_the_capacity(trained, scratch):
    """Mode auto at batches too long for this machine (told to the engines of the training
    test after it): the engine recomputes the blocks zeroshard-estimate --ac-mode auto gives
    its stage on a device of the engine's capacity, and some need some blocks, not all."""
    path = scratch / "config.json"
    layered("llama").to_json_file(str(path))
    needed = set()
    for stage in (2, 3):
        run = trained[0][f"auto stage {stage}"]
        for seq, (whole, ops) in zip(LONG, run["long"]):
            planned = subprocess.run(
                [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config", str(path),
                 "--gpus-per-node", "2", "--micro-batch", str(BATCH), "--bf16", "--json",
                 "--seq", str(seq), "--ac-mode", "auto", "--gpu-mem", str(run["capacity"])],
                capture_output=True, text=True, timeout=60)
            row = next(r for r in json.loads(planned.stdout)["options"] if r["stage"] == stage
                       and r["offload_optimizer"] == "none" and r["offload_param"] == "none")
            assert (whole, ops) == (row["recomputed_blocks"], 0), (stage, seq, planned.stdout)
            needed.add(whole)
    assert any(0 < n < LAYERS for n in needed) and 0 in needed, needed


def test_config_refusals():
    import zeroshard
    cases = [
        ({"mode": "selective", "selective_ac_option": "every"},
         "'activation_checkpointing.selective_ac_option' is 'every'; allowed: op (every block "
         "keeps its matmul outputs and recomputes the rest) or a positive integer N"),
        ({"mode": "full", "memory_budget": 0.3},
         "'activation_checkpointing.memory_budget' is 0.3 with mode 'full'; allowed: mode "
         "memory_budget, or leave memory_budget out"),
        ({"selective_ac_option": 2},
         "'activation_checkpointing.selective_ac_option' is '2' with mode 'none'"),
        ({"enabled": True, "mode": "full"},
         "'activation_checkpointing.enabled' true and 'activation_checkpointing.mode' 'full': "
         "enabled tells the planner the model recomputes its own blocks"),
        ({"mode": "sometimes"}, "allowed: one of none, full, selective, memory_budget"),
    ]
    for keys, message in cases:
        with pytest.raises(zeroshard.Error, match=None) as caught:
            zeroshard.load_config({"activation_checkpointing": keys})
        assert message in str(caught.value), (keys, str(caught.value))


def test_model_refusals():
    """No blocks to recompute, pipeline stages, the model's own gradient checkpointing beside
    a mode, auto for a model whose activations the planner cannot count: each refused by
    name (when the engine is built; the last two at a forward). The blocks found; a copy
    of the model runs its own weights."""
    import torch
    import transformers
    import zeroshard
    from zeroshard._activations import policy
    with pytest.raises(zeroshard.Error, match=r"activation_checkpointing.mode 'full': the model "
                                              r"\(a Linear\) has no blocks to recompute"):
        policy.Recompute(None, torch.nn.Linear(4, 4), "full", "op", 0.5)
    from zeroshard._common import config
    loaded = config.parse({"activation_checkpointing": {"mode": "full"}})
    with pytest.raises(zeroshard.Error, match=r"activation_checkpointing.mode 'full' with 2 "
                                              r"pipeline stages: not composed in zeroshard yet"):
        policy.apply(None, torch.nn.Sequential(torch.nn.Linear(4, 4)), loaded, stages=2)
    model = transformers.AutoModelForCausalLM.from_config(layered("llama", 2))
    assert [type(b).__name__ for b in policy.blocks(model)] == ["LlamaDecoderLayer"] * 2
    stack = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    assert policy.blocks(stack) == [stack[0], stack[2]]
    uncounted = policy.Recompute(lambda: None, stack, "auto", "op", 0.5)
    with pytest.raises(zeroshard.Error, match=r"activation_checkpointing.mode auto: the planner "
                                              r"cannot count this model's activations"):
        uncounted.begin_forward()
    policy.Recompute(None, model, "full", "op", 0.5)
    model.gradient_checkpointing_enable()
    ids = torch.zeros(1, 8, dtype=torch.long)
    recompute = model.model.layers[0]._zeroshard_recompute[0]
    with pytest.raises(zeroshard.Error, match=r"activation_checkpointing.mode 'full' and the "
                                              r"model's own gradient checkpointing"):
        recompute.begin_forward()
    model.gradient_checkpointing_disable()
    # A second engine's policy over the first's: each block's own forward, checkpointed once.
    policy.Recompute(None, model, "selective", "2", 0.5)
    calls = []
    checkpoint = policy.torch_checkpoint.checkpoint
    policy.torch_checkpoint.checkpoint = lambda *a, **k: calls.append(1) or checkpoint(*a, **k)
    try:
        model(input_ids=ids)
    finally:
        policy.torch_checkpoint.checkpoint = checkpoint
    assert len(calls) == 1
    copied = copy.deepcopy(model)  # the copy's blocks run the copy's weights
    with torch.no_grad():
        copied.model.layers[0].mlp.down_proj.weight.zero_()
    assert not torch.equal(model(input_ids=ids).logits, copied(input_ids=ids).logits)


def test_estimator_flags(scratch):
    config = layered("llama")
    path = scratch / "config.json"
    config.to_json_file(str(path))
    tool = os.path.join(BUILD, "tools", "zeroshard-estimate")
    for args, message in [
            (["--ac-mode", "sometimes"], "--ac-mode: 'sometimes' is not allowed; allowed: none, "
                                         "full, selective, memory_budget"),
            (["--ac-mode", "full", "--activation-checkpointing"],
             "--activation-checkpointing and --ac-mode full: allowed: one of the two"),
            (["--memory-budget", "2"], "--memory-budget: '2' is not allowed; allowed: a "
                                       "fraction in [0, 1]"),
            (["--ac-mode", "full", "--ac-option", "3"],
             "'activation_checkpointing.selective_ac_option' is '3' with mode 'full'")]:
        out = subprocess.run([tool, "--hf-config", str(path), *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    out = subprocess.run([tool, "--hf-config", str(path), "--seq", str(SEQ), "--ac-mode",
                          "selective", "--ac-option", "2"], capture_output=True, text=True,
                         timeout=60)
    assert "activation checkpointing selective 2" in out.stdout, out.stdout
