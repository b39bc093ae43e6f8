"""The config crosses from Python to C++ once per initialize: parsed by the C++ loader into
one object that every question Python asks of it (its warnings, its top-level keys, a
torch.optim class it names, its stage) and the engine itself read."""
from conftest import run_snippet

COUNTED = (
    "from zeroshard import _zeroshard\n"
    "parse, parsed = _zeroshard.parse_config, []\n"
    "def counting(text, origin):\n"
    "    parsed.append(origin)\n"
    "    return parse(text, origin)\n"
    "_zeroshard.parse_config = counting\n")


def test_initialize_parses_its_config_once():
    # A torch.optim class and a key DeepSpeed knows that zeroshard ignores (a warning): each
    # once asked its own parse of the YAML text.
    code, out = run_snippet(
        COUNTED +
        "config = {'zero_optimization': {'stage': 3}, 'wall_clock_breakdown': True,\n"
        "          'optimizer': {'type': 'SGD', 'params': {'lr': 0.1, 'momentum': 0.9}}}\n"
        "engine, *_ = zeroshard.initialize(model=model, config=config)\n"
        "loss = engine(torch.ones(2, 4)).sum()\n"
        "engine.backward(loss)\nengine.step()\n"
        "print('parsed', parsed, engine.zero_optimization_stage())")
    assert code == 0, out
    assert "parsed ['config dict'] 3" in out, out
    assert out.count("zeroshard warning: ") == 1 and "wall_clock_breakdown" in out, out


def test_the_parsed_config_answers_what_python_asks():
    code, out = run_snippet(
        "from zeroshard import _zeroshard\n"
        "c = _zeroshard.parse_config('{\"optimizer\": {\"type\": \"Adagrad\", \"params\": "
        "{\"lr\": 0.5}}, \"zero_optimization\": {\"stage\": \"auto\"}}', 'here.json')\n"
        "print(c.origin, c.top_level_keys, c.stage, c.torch_optimizer)")
    assert code == 0, out
    assert "here.json ['optimizer', 'zero_optimization'] None ('Adagrad', {'lr': '0.5'})" in out
