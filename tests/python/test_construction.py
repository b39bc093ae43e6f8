"""Sharded construction (zeroshard.init) and models built on the meta device, on 2 ranks.

A model built under zeroshard.init starts from exactly the values of the same model built
plainly with the same seed (every parameter, compared whole after initialize) and trains
to the same losses; building it holds at most 0.6x the model plus one block per rank
(peak RSS, the kernel's high-water mark), where a plain build holds the whole model."""
import importlib.util
import os

import pytest

from conftest import HERE, run_ranks
from conftest import run_snippet as run_one

WORKER = os.path.join(HERE, "construction_worker.py")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def run(scratch, mode, model, extra_env=None):
    out = str(scratch / f"{mode}_{model}")
    return run_ranks([WORKER, mode, model, out], 2, out, timeout=600, extra_env=extra_env)


def max_difference(a, b):
    import torch
    assert a.keys() == b.keys()
    return max((torch.tensor(a[n]) - torch.tensor(b[n])).abs().max().item() for n in a)


@pytest.mark.parametrize("model", [
    "gpt",
    pytest.param("llama", marks=pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")),
    pytest.param("gpt2", marks=pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")),
])
def test_built_sharded_starts_and_trains_as_built_plainly(scratch, model):
    plain, sharded = run(scratch, "plain", model), run(scratch, "sharded", model)
    for rank in range(2):
        # Every parameter was a shard when the context ended (gpt2's head is its token
        # embedding, counted once).
        assert sharded[rank]["sharded_numel"] == sharded[rank]["numel"] > 0
        assert max_difference(plain[rank]["initial"], sharded[rank]["initial"]) == 0
        assert sharded[rank]["losses"] == pytest.approx(plain[rank]["losses"], abs=1e-6)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
def test_from_pretrained_under_the_context_loads_sharded(scratch):
    import sys
    sys.path.insert(0, HERE)
    import hf_worker
    hf_worker.make("llama").save_pretrained(scratch / "llama")  # the plain mode's weights
    loaded = run(scratch, "pretrained", "llama", {"ZS_PRETRAINED": str(scratch / "llama")})
    plain = run(scratch, "plain", "llama")
    for rank in range(2):
        assert loaded[rank]["sharded_numel"] == loaded[rank]["numel"] > 0
        assert max_difference(plain[rank]["initial"], loaded[rank]["initial"]) == 0
        assert loaded[rank]["losses"] == pytest.approx(plain[rank]["losses"], abs=1e-6)


def test_a_model_built_on_meta_is_made_by_reset_parameters(scratch):
    import torch
    ranks = run(scratch, "meta", "gpt")
    assert max_difference(ranks[0]["initial"], ranks[1]["initial"]) == 0  # rank 0's values
    initial = {n: torch.tensor(v) for n, v in ranks[0]["initial"].items()}
    for name, t in initial.items():
        assert torch.isfinite(t).all(), name
        if ".ln" in name or name.startswith("ln_f"):
            assert (t == (1 if name.endswith("weight") else 0)).all(), name  # LayerNorm's
        elif name.endswith("weight") and t.dim() == 2 and name.startswith("blocks"):
            bound = t.shape[1] ** -0.5  # Linear: kaiming_uniform(a=sqrt(5)) <= 1/sqrt(fan_in)
            assert t.abs().max() <= bound and t.std() > bound / 4, name
    assert 0.9 < initial["tok.weight"].std() < 1.1  # Embedding: N(0, 1)
    losses = ranks[0]["losses"]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_building_holds_a_shard_of_the_model_not_all_of_it(scratch):
    sharded, plain = run(scratch, "peak", "sharded"), run(scratch, "peak", "plain")
    mib = 2**20
    for rank in range(2):
        s, p = sharded[rank], plain[rank]
        model, block = s["model_bytes"], s["block_bytes"]
        print(f"rank {rank}: model {model / mib:.0f} MiB, block {block / mib:.0f} MiB; "
              f"construction peak {s['construction_peak'] / mib:.0f} MiB sharded "
              f"({s['construction_peak'] / model:.2f}x), {p['construction_peak'] / mib:.0f} "
              f"MiB plain ({p['construction_peak'] / model:.2f}x); initialize "
              f"{s['initialize_peak'] / mib:.0f} vs {p['initialize_peak'] / mib:.0f} MiB, "
              f"ledger peak {s['ledger_peak'] / mib:.0f} MiB")
        # A shard of each unit (half the model on two ranks) and the block being built,
        # whole; RSS also sees the process's own allocations, which come and go (measured
        # 12-40 MiB above the first two): well below the whole model plain building holds.
        assert s["construction_peak"] <= model / 2 + block + 64 * mib
        assert p["construction_peak"] >= model  # the measure sees a whole model
        # Making the engine from shards gathers one unit at a time: its peak is what the
        # engine counts plus about two blocks (the unit whole and its flat copy).
        assert s["initialize_peak"] <= s["ledger_peak"] + 2 * block


def test_deepspeed_options_zeroshard_does_not_take_are_refused_by_name():
    code, out = run_one("zeroshard.init(config={'zero_optimization': {'stage': 3}}, "
                        "remote_device='cpu')")
    assert code != 0
    assert ("zeroshard.init: 'remote_device' is a DeepSpeed zero.Init option zeroshard does "
            "not take; allowed: module, config, config_dict_or_path, enabled") in out


def test_meta_parameters_need_a_module_that_can_make_them():
    code, out = run_one("""
class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(4))
with torch.device('meta'):
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale())
zeroshard.initialize(model=m, config={'train_micro_batch_size_per_gpu': 1})""")
    assert code != 0
    assert ("parameter 'gain' of Scale is on the meta device and Scale has no "
            "reset_parameters() to make it") in out


def test_initialize_inside_the_context_is_refused():
    code, out = run_one("""
with zeroshard.init(config={'zero_optimization': {'stage': 3}}):
    m = torch.nn.Sequential(torch.nn.Linear(4, 4))
    zeroshard.initialize(model=m, config={'zero_optimization': {'stage': 3}})""")
    assert code != 0
    assert "zeroshard.initialize was called inside a zeroshard.init context" in out


def test_an_engine_forgets_the_parameters_that_are_gone():
    """engine_of finds the engine a parameter is trained by; the table behind it keeps no
    entry of a parameter that no longer exists, however many models come and go."""
    code, out = run_one(
        "import gc\n"
        "from zeroshard._engine import engine as _engine\n"
        "cfg = {'train_micro_batch_size_per_gpu': 1, 'zero_optimization': {'stage': 3},\n"
        "       'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}}}\n"
        "for i in range(20):\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))\n"
        "    e = zeroshard.initialize(model=m, config=cfg)[0]\n"
        "    assert all(_engine.engine_of(p) is e for p in m.parameters())\n"
        "    del e, m\n"
        "    gc.collect()\n"
        "print('held', len(_engine._holders))\n")
    assert code == 0, out
    assert "held 0" in out, out
