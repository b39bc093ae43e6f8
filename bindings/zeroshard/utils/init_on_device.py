"""deepspeed.OnDevice: build a model's tensors on a device (the meta device by default) and
in a dtype; zeroshard.initialize materialises meta parameters one unit at a time."""
import torch

from .. import _zeroshard


class OnDevice:
    """with OnDevice(dtype=torch.bfloat16, device="meta"): model = Model(...)"""

    def __init__(self, dtype, device="meta", enabled=True):
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise _zeroshard.Error(f"OnDevice(dtype={dtype!r}): allowed: a floating torch dtype "
                                   "or None")
        self.dtype, self.device, self.enabled = dtype, torch.device(device), enabled
        self._entered = None

    def __enter__(self):
        if self.enabled:
            self._entered = (self.device, torch.get_default_dtype())
            self.device.__enter__()
            if self.dtype is not None:
                torch.set_default_dtype(self.dtype)
        return self

    def __exit__(self, *exc):
        if self._entered is not None:
            device, dtype = self._entered
            torch.set_default_dtype(dtype)
            device.__exit__(*exc)
            self._entered = None
        return False
