"""Stage-3 units: one rule in both languages (engine/UnitPartition.h). The model and the
expectation are tests/engine/UnitPartitionTest.cpp's, so a change to either side fails
one of them; Hugging Face models get every parameter in a unit."""
import importlib.util

import pytest
import torch
import torch.nn as nn

from zeroshard._engine.units import quantizable_names, stage3_units, unique_parameters


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.ModuleList([nn.Linear(8, 8)])
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)),
                                     nn.Dropout(0.1), nn.Linear(8, 8)])
        self.grid = nn.ModuleList([nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])])
        self.extras = nn.ParameterList([nn.Parameter(torch.ones(8))])
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(x * self.extras[0])


class TiedHead(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.weight = embedding
        self.bias = nn.Parameter(torch.zeros(embedding.shape[0]))

    def forward(self, h):
        return h @ self.weight.t() + self.bias


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.embed = nn.Embedding(16, 8)
        self.body = Body()
        self.head = TiedHead(self.embed.weight)

    def forward(self, x):  # a forward of its own: it is where its own parameter is gathered
        return x


def names(units):
    return [[n for n, _ in ps] for _, ps in units]


def test_every_stacks_blocks_and_every_parameter_left_over():
    model = Nested()
    units = stage3_units(model)
    mods = [[id(m) for m in ms] for ms, _ in units]
    body = model.body
    assert mods == [[id(model)], [id(model.embed), id(model.head)], [id(body.small[0])],
                    [id(body.layers[0])], [id(body.layers[2])], [id(body.grid[0][0])],
                    [id(body.grid[0][1])], [id(body)], [id(body.norm)]]
    got = names(units)
    assert got[0] == ["scale"]
    assert got[1] == ["embed.weight", "head.bias"]  # tied: one unit, gathered where either runs
    assert got[3] == ["body.layers.0.0.weight", "body.layers.0.0.bias",
                      "body.layers.0.1.weight", "body.layers.0.1.bias"]
    assert got[7] == ["body.extras.0"]  # a ParameterList: its parent's forward gathers it
    assert sorted(n for u in got for n in u) == sorted(n for n, _ in model.named_parameters())


def test_only_linear_and_embedding_weights_are_quantizable():
    """As tests/engine/UnitPartitionTest.cpp: DeepSpeed's classes matched exactly (a
    subclass of nn.Linear is not one), the embedding once though the head reads it."""
    class OwnLinear(nn.Linear):
        pass

    model = Nested()
    model.body.small.append(OwnLinear(8, 8))
    got = quantizable_names(model, unique_parameters(model))
    assert got == {"embed.weight", "body.small.0.weight", "body.layers.0.0.weight",
                   "body.layers.0.1.weight", "body.layers.2.weight", "body.grid.0.0.weight",
                   "body.grid.0.1.weight"}


def test_declared_units_and_the_innermost_wins():
    model = Nested()
    units = stage3_units(model, [model.body, "body.layers.2"])
    assert [[id(m) for m in ms] for ms, _ in units][2:] == [[id(model.body)],
                                                             [id(model.body.layers[2])]]
    got = names(units)
    assert len(got) == 4 and len(got[2]) == 13  # everything under the body but layers.2's 2
    assert got[3] == ["body.layers.2.weight", "body.layers.2.bias"]


def test_a_model_without_a_stack_is_one_unit():
    linear = nn.Linear(4, 4)
    assert [[id(m) for m in ms] for ms, _ in stage3_units(linear)] == [[id(linear)]]
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    assert [[id(m) for m in ms] for ms, _ in stage3_units(seq)] == [[id(seq[0])], [id(seq[2])]]


def test_a_declared_unit_outside_the_model_is_refused():
    import zeroshard
    with pytest.raises(zeroshard.Error, match="units: 'nowhere' is not a submodule"):
        stage3_units(Nested(), ["nowhere"])
    with pytest.raises(zeroshard.Error, match="units: a Linear that is not a submodule"):
        stage3_units(Nested(), [nn.Linear(2, 2)])


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed beside this interpreter (the trixie "
                           "leg): the main leg runs this test")
def test_hugging_face_models_have_every_parameter_in_a_unit():
    import transformers
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2,
        num_heads=2, tie_word_embeddings=True))
    units = stage3_units(t5)
    mods = [[id(m) for m in ms] for ms, _ in units]
    # The shared embedding, the encoder's and the decoder's (modules of their own that hold
    # its weight) and the tied head: one unit, first.
    assert mods[0] == [id(t5.shared), id(t5.encoder.embed_tokens), id(t5.decoder.embed_tokens),
                       id(t5.lm_head)]
    blocks = [[id(b)] for b in list(t5.encoder.block) + list(t5.decoder.block)]
    assert all(b in mods for b in blocks)
    assert [id(t5.encoder.final_layer_norm)] in mods and [id(t5.decoder.final_layer_norm)] in mods
    assert len(units) == 7
    count = sum(p.numel() for _, ps in units for _, p in ps)
    assert count == sum(p.numel() for p in t5.parameters())  # each once
