"""DeepSpeed's module tree as scripts use it: every deepspeed.* name in
tests/python/deepspeed_names.json (what DeepSpeedExamples, Megatron-DeepSpeed, transformers,
accelerate and TRL import or call, with how often) works under zeroshard.<same path>, or is
refused by name with what to use instead, as the file records; most of the uses in
DeepSpeedExamples' training scripts work. Then what the working names do, each against a
reference computed another way."""
import importlib
import json
import os

import pytest
import torch

from conftest import HERE, main_leg_only

import zeroshard

with open(os.path.join(HERE, "deepspeed_names.json")) as f:
    NAMES = json.load(f)["names"]


def resolve(name):
    """zeroshard's object at deepspeed's dotted `name`: the longest importable module, then
    attributes, as `from deepspeed.a.b import c` and `deepspeed.a.b.c` reach it."""
    parts = ("zeroshard" + name[len("deepspeed"):]).split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError:
            continue
    for part in parts[i:]:
        found = getattr(found, part)
    return found


def refused_by_name(name, error):
    said = str(error)
    return said.startswith("deepspeed.") and name.startswith(said.split()[0]) and \
        "instead:" in said


@main_leg_only
@pytest.mark.parametrize("entry", NAMES, ids=[n["name"] for n in NAMES])
def test_each_name_scripts_use_works_or_is_refused_by_name(entry):
    name, expected = entry["name"], entry["zeroshard"]
    if expected == "refused":
        with pytest.raises(zeroshard.Error) as caught:
            resolve(name)
        assert refused_by_name(name, caught.value), str(caught.value)
        return
    found = resolve(name)  # works: no error on the way
    assert not isinstance(found, zeroshard._common.refusals.Refused), name
    if expected == "refused_when_called":
        with pytest.raises(zeroshard.Error, match=name.rsplit(".", 1)[-1]):
            found()


def test_nine_in_ten_uses_in_deepspeeds_training_examples_work():
    """Of the uses in DeepSpeedExamples' training/ scripts of names DeepSpeed 0.19.8 has (its
    sparse attention, gone from it, is refused here too), at least 90% work."""
    uses = [(n["uses"].get("DeepSpeedExamples/training", 0), n["zeroshard"] == "works")
            for n in NAMES if n["in_deepspeed_0_19_8"]]
    working, total = sum(u for u, w in uses if w), sum(u for u, _ in uses)
    print(f"DeepSpeedExamples training/: {working} of {total} uses work "
          f"({100 * working / total:.1f}%)")
    assert working >= 0.9 * total, (working, total)


@main_leg_only
def test_a_module_deepspeed_lacks_is_refused_at_import_and_a_name_at_reading():
    with pytest.raises(zeroshard.Error, match=r"^deepspeed\.ops\.sparse_attention is not in "
                                              r"zeroshard: .*; instead: "):
        importlib.import_module("zeroshard.ops.sparse_attention.sparse_self_attention")
    with pytest.raises(zeroshard.Error, match=r"^deepspeed\.utils\.set_z3_leaf_modules .*"
                                              r"instead: initialize\(units="):
        from zeroshard.utils import set_z3_leaf_modules  # noqa: F401
    with pytest.raises(AttributeError):  # a name DeepSpeed does not have either: Python's error
        zeroshard.utils.no_such_name
    # A script's fallback where DeepSpeed lacks a name (Megatron-DeepSpeed's, around
    # deepspeed.sequence's FPDT) takes the refusal as the ImportError it expects.
    try:
        from zeroshard.sequence.fpdt_layer import FPDT_Attention  # noqa: F401
        fell_back = False
    except ImportError as e:
        fell_back = (isinstance(e, zeroshard.Error)
                     and "deepspeed.sequence.fpdt_layer is not in zeroshard" in str(e))
    assert fell_back
    with pytest.raises(ImportError, match="deepspeed.sequence.auto_wrap_model_for_sp is not"):
        from zeroshard.sequence import auto_wrap_model_for_sp  # noqa: F401
    with pytest.raises(ImportError, match="ALST's generic tiled compute"):
        from zeroshard.runtime.sequence_parallel.ulysses_sp import sequence_tiled_compute  # noqa: F401,E501
    with pytest.raises(ImportError, match="deepspeed.utils.groups._create_model_parallel "
                                          "is not in zeroshard"):
        from zeroshard.utils.groups import _create_model_parallel  # noqa: F401
    with pytest.raises(zeroshard.Error, match="_INSTRUCTION_MAP is not in zeroshard"):
        zeroshard.runtime.pipe.engine.PipelineEngine._INSTRUCTION_MAP["x"] = None


@pytest.mark.parametrize("pre_layer_norm", [True, False])
def test_deepspeeds_fused_bert_layer_is_torchs_transformer_layer(pre_layer_norm):
    """DeepSpeedTransformerLayer against torch.nn.TransformerEncoderLayer with the same
    weights (its norm_first for the pre-LN order; the first LayerNorm of the pre-LN layer is
    DeepSpeed's norm_w, of the post-LN one its attn_nw), a padding mask in DeepSpeed's
    additive form: outputs and every gradient within 1e-5 of the largest value of each."""
    torch.manual_seed(0)
    h, heads, inner, b, s = 32, 4, 64, 3, 7
    config = zeroshard.DeepSpeedTransformerConfig(
        batch_size=b, hidden_size=h, intermediate_size=inner, heads=heads,
        attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, num_hidden_layers=2,
        initializer_range=0.2, pre_layer_norm=pre_layer_norm, gelu_checkpoint=True)
    ours = zeroshard.DeepSpeedTransformerLayer(config)
    with torch.no_grad():
        ours.attn_qkvb.normal_()
        ours.attn_nw.normal_()
        ours.norm_b.normal_()
    ref = torch.nn.TransformerEncoderLayer(
        h, heads, inner, dropout=0.0, activation=lambda t: torch.nn.functional.gelu(
            t, approximate="tanh"), layer_norm_eps=1e-12, batch_first=True,
        norm_first=pre_layer_norm)
    first, second = ("norm_", "attn_n") if pre_layer_norm else ("attn_n", "norm_")
    pairs = {"self_attn.in_proj_weight": "attn_qkvw", "self_attn.in_proj_bias": "attn_qkvb",
             "self_attn.out_proj.weight": "attn_ow", "self_attn.out_proj.bias": "attn_ob",
             "linear1.weight": "inter_w", "linear1.bias": "inter_b",
             "linear2.weight": "output_w", "linear2.bias": "output_b",
             "norm1.weight": first + "w", "norm1.bias": first + "b",
             "norm2.weight": second + "w", "norm2.bias": second + "b"}
    ref.load_state_dict({k: getattr(ours, v).detach() for k, v in pairs.items()})
    x = torch.randn(b, s, h)
    pad = torch.zeros(b, s, dtype=torch.bool)
    pad[0, 5:] = pad[2, 3:] = True
    additive = (pad.float() * -10000.0).view(b, 1, 1, s)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = ours(x1, additive)
    want = ref(x2, src_key_padding_mask=pad)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    (got * torch.arange(h)).sum().backward()
    (want * torch.arange(h)).sum().backward()
    near = lambda a, r: (a - r).abs().max() <= 1e-5 * max(1.0, r.abs().max())  # noqa: E731
    assert near(x1.grad, x2.grad), (x1.grad - x2.grad).abs().max()
    for k, v in pairs.items():
        a, r = getattr(ours, v).grad, ref.get_parameter(k).grad
        assert near(a, r), (k, (a - r).abs().max())


@main_leg_only
def test_deepspeed_config_resolves_the_batch_keys_over_the_data_parallel_ranks():
    class Mpu:
        def get_data_parallel_world_size(self):
            return 2

    config = {"train_batch_size": 32, "gradient_accumulation_steps": 4,
              "fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    alone, over_two = zeroshard.DeepSpeedConfig(config), zeroshard.DeepSpeedConfig(config, Mpu())
    assert (alone.train_micro_batch_size_per_gpu, over_two.train_micro_batch_size_per_gpu) == (8, 4)
    assert alone.fp16_enabled and alone.zero_optimization_stage == 2 and alone.zero_enabled
    assert zeroshard.DeepSpeedConfig({"train_micro_batch_size_per_gpu": 3}, Mpu()).train_batch_size == 6
    with pytest.raises(zeroshard.Error, match="do not fit 2 ranks"):
        zeroshard.DeepSpeedConfig({"train_batch_size": 7, "gradient_accumulation_steps": 1}, Mpu())
    with pytest.raises(zeroshard.Error, match="train_batch_siz"):
        zeroshard.DeepSpeedConfig({"train_batch_siz": 8})


@main_leg_only
def test_deepspeeds_adam_classes_are_torchs_and_what_they_cannot_do_is_refused():
    from zeroshard.ops.adagrad import DeepSpeedCPUAdagrad
    from zeroshard.ops.adam import DeepSpeedCPUAdam, FusedAdam
    params = [torch.nn.Parameter(torch.ones(3))]
    adamw = DeepSpeedCPUAdam(params, lr=0.01, betas=(0.8, 0.9), weight_decay=0.1)
    assert type(adamw) is torch.optim.AdamW
    assert adamw.defaults["lr"] == 0.01 and adamw.defaults["betas"] == (0.8, 0.9)
    assert type(FusedAdam(params, adam_w_mode=False)) is torch.optim.Adam
    assert type(DeepSpeedCPUAdagrad(params, lr=0.1)) is torch.optim.Adagrad
    with pytest.raises(zeroshard.Error, match="amsgrad"):
        FusedAdam(params, amsgrad=True)
    with pytest.raises(zeroshard.Error, match="bias_correction"):
        DeepSpeedCPUAdam(params, bias_correction=False)


@main_leg_only
def test_on_device_builds_on_the_meta_device_in_the_dtype_and_restores_both():
    with zeroshard.OnDevice(dtype=torch.bfloat16, device="meta"):
        layer = torch.nn.Linear(4, 4)
    assert layer.weight.device.type == "meta" and layer.weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32 and torch.ones(1).device.type == "cpu"
    with zeroshard.OnDevice(dtype=torch.float16, enabled=False):
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float32
