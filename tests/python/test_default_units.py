"""Default stage-3 units: one rule in both languages. The model and the expectation
are tests/engine/DefaultUnitsTest.cpp's, so a change to either side fails one of them."""
import importlib.util

import pytest
import torch.nn as nn

from zeroshard.engine import default_units


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.ModuleList([nn.Linear(8, 8)])
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)),
                                     nn.Dropout(0.1), nn.Linear(8, 8)])
        self.norm = nn.LayerNorm(8)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.body = Body()
        self.head = nn.Linear(8, 16)


def test_the_blocks_with_parameters_of_the_largest_stack():
    model = Nested()
    # layers (216 parameters) beats small (72) and the Sequential inside it; the Dropout
    # has nothing to shard; embed, norm and head stay in the root groups.
    units = default_units(model)
    assert [id(u) for u in units] == [id(model.body.layers[0]), id(model.body.layers[2])]


def test_a_model_without_a_stack_has_none():
    assert default_units(nn.Linear(4, 4)) == []
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    assert [id(u) for u in default_units(seq)] == [id(seq[0]), id(seq[2])]  # the root


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed beside this interpreter (the trixie "
                           "leg): the main leg runs this test")
def test_hugging_face_models_get_their_decoder_layers():
    import transformers
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2))
    assert [id(u) for u in default_units(llama)] == [id(m) for m in llama.model.layers]
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4))
    assert [id(u) for u in default_units(gpt2)] == [id(m) for m in gpt2.transformer.h]
