"""deepspeed.compression.helper: reading and replacing a submodule by its dotted name."""
from .._common import refusals as _refusals

__getattr__ = _refusals.attribute_refuser(__name__)


def recursive_getattr(model, module_name):
    """model's submodule (or attribute) at the dotted path module_name."""
    for name in module_name.split("."):
        model = getattr(model, name)
    return model


def recursive_setattr(model, module_name, module):
    """Replaces model's submodule at the dotted path module_name with `module`."""
    *parents, last = module_name.split(".")
    for name in parents:
        model = getattr(model, name)
    setattr(model, last, module)
