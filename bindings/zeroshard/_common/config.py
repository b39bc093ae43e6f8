"""Config input as users give it (a YAML/JSON path or a dict, DeepSpeed's keys), parsed
once by the C++ loader (parse): the engine and every question asked of the config read
that one object. Errors name the key, value and what is allowed; they come from the same
loader as the C++ API and the CLI."""
import json
import os

from .. import _zeroshard


def load_config(config):
    """Returns (yaml_text, origin) for a path or a dict; raises Error on bad input."""
    text, origin = _read(config)
    parse_text(text, origin)
    return text, origin


def parse(config):
    """The config (a path or a dict) parsed: _zeroshard.LoadedConfig; raises Error on bad
    input. Its warnings are said once per process (init and initialize both parse it)."""
    return parse_text(*_read(config))


def parse_text(text, origin):
    loaded = _zeroshard.parse_config(text, origin)
    for warning in loaded.warnings:
        if warning not in _said:
            _said.add(warning)
            print(f"zeroshard warning: {warning}", flush=True)
    return loaded


def _read(config):
    """(text, origin): a file's text, or a dict as JSON (which is YAML)."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise _zeroshard.Error(
                f"config file '{path}' does not exist (working directory {os.getcwd()}); "
                "allowed: a path to a YAML or JSON file, or a dict")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        origin = path
    elif isinstance(config, dict):
        text = json.dumps(config)  # JSON is YAML
        origin = "config dict"
    else:
        raise _zeroshard.Error(
            f"config: a {type(config).__name__} is not allowed; allowed: a path or a dict")
    return text, origin


_said = set()


def as_mapping(config, check=True):
    """(the config as a dict, where it came from): a path to YAML or JSON, or a dict. The
    front-ends (the Trainer's, the Accelerator's) fill it before the engine parses it;
    check=False leaves the parse to the engine, for a front-end that first takes out keys
    it reads itself (a PipelineModule's activation_checkpoint_interval)."""
    import yaml  # a dependency of transformers and of accelerate
    text, origin = load_config(config) if check else _read(config)
    loaded = yaml.safe_load(text) or {}
    if not isinstance(loaded, dict):
        raise _zeroshard.Error(f"{origin}: a {type(loaded).__name__} at the top level; allowed: "
                               "a mapping")
    return loaded, origin


def fill(config, path, value, source, origin):
    """config[path] = value where missing or 'auto'; an error where it says otherwise
    (`source` names where the value comes from: "TrainingArguments.bf16")."""
    *parents, key = path.split(".")
    node = config
    for p in parents:
        node = node.setdefault(p, {})
    given = node.get(key, "auto")
    if given == "auto":
        node[key] = value
    elif given != value:
        raise _zeroshard.Error(f"{origin}: {path} is {given!r} but {source} is {value!r}; "
                               f"set one of them to match the other (or {path}: auto)")
