"""The tensors inside a module's arguments or output: nested tuples, lists and dicts."""
import torch


def tensors(output):
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for o in output:
            yield from tensors(o)
    elif isinstance(output, dict):
        for o in output.values():
            yield from tensors(o)
