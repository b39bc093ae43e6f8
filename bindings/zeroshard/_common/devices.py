"""The accelerator this process trains on, DeepSpeed's way: DS_ACCELERATOR ('cuda' or
'cpu') where it is set, else CUDA where torch sees a GPU, else the CPU. The accelerator
object (zeroshard.accelerator) and the model's placement (_parallel/placement.py) both ask
here."""
import os

import torch

from .. import _zeroshard


def accelerator_name():
    name = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cuda", "cpu"):
        raise _zeroshard.Error(f"DS_ACCELERATOR={name!r}: zeroshard runs on 'cuda' or 'cpu'")
    return name
