"""Pretrained weights, loaded with from_pretrained from safetensors (one file, or shards),
train on 2 ranks at stages 1, 2, 3 and 3 with offload to the losses of the same model built
from its config with the same values. Loaded weights live in storage that Python owns (the
file's map): a collective that kept one and was freed on Gloo's thread while the engine held
the GIL deadlocked construction (bindings/PyEngine.cpp, DeleteWithoutGil)."""
import importlib.util
import os
import sys

import pytest

from conftest import HERE, both_legs, run_ranks

WORKER = os.path.join(HERE, "pretrained_worker.py")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
STEPS = 3


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
@pytest.mark.parametrize("model,shards", [
    both_legs("llama", None),
    ("gpt2", None),  # the head tied to the token embedding
    ("t5", None),  # encoder-decoder, its shared embedding under three names
    ("llama", "40KB"),  # saved in several files
])
def test_pretrained_weights_train_as_the_model_built_with_them(scratch, model, shards):
    sys.path.insert(0, HERE)
    import hf_worker
    folder = scratch / f"{model}-saved"
    hf_worker.make(model).save_pretrained(folder, **({"max_shard_size": shards} if shards else {}))
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(files) > 1 if shards else files == ["model.safetensors"]
    out = str(scratch / model)
    ranks = run_ranks([WORKER, model, str(folder), str(STEPS), out], 2, out, timeout=300)
    for rank in ranks:
        for case, runs in rank.items():
            assert len(runs["loaded"]) == STEPS, case
            assert runs["loaded"] == pytest.approx(runs["built"], rel=1e-6, abs=0), case
