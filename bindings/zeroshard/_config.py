"""Config input as users give it (a YAML/JSON path or a dict, DeepSpeed's keys), turned
into the YAML text the C++ loader validates. Errors name the key, value and what is
allowed; they come from the same loader as the C++ API and the CLI."""
import json
import os

from . import _zeroshard


def load_config(config):
    """Returns (yaml_text, origin) for a path or a dict; raises Error on bad input."""
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
    for warning in _zeroshard.config_warnings(text, origin):
        if warning not in _said:  # once per process: init and initialize both load it
            _said.add(warning)
            print(f"zeroshard warning: {warning}", flush=True)
    return text, origin


_said = set()
