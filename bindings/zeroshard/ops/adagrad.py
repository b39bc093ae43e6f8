"""deepspeed.ops.adagrad: DeepSpeedCPUAdagrad as torch's Adagrad, which zeroshard.initialize
takes as a client optimizer."""
import torch

from .. import _zeroshard


class DeepSpeedCPUAdagrad(torch.optim.Optimizer):
    """deepspeed.ops.adagrad.DeepSpeedCPUAdagrad(model_params, lr, eps, weight_decay,
    amsgrad, fp32_optimizer_states): a torch Adagrad with the same lr, eps and weight_decay."""

    def __new__(cls, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False,
                fp32_optimizer_states=True):
        if amsgrad or not fp32_optimizer_states:
            raise _zeroshard.Error("DeepSpeedCPUAdagrad: amsgrad=True and "
                                   "fp32_optimizer_states=False are not supported; allowed: "
                                   "the defaults")
        return torch.optim.Adagrad(model_params, lr=lr, eps=eps, weight_decay=weight_decay)
