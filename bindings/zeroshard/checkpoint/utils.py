"""deepspeed.checkpoint.utils: clone_tensors_for_torch_save."""
import torch


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """`item` with each tensor in it (nested in lists, tuples and dicts) a detached copy on
    `device`, so that torch.save writes no more than each tensor's own bytes."""
    if torch.is_tensor(item):
        device = torch.device(device)
        return item.detach().clone() if item.device == device else item.detach().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item
