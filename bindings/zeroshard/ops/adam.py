"""deepspeed.ops.adam: DeepSpeedCPUAdam and FusedAdam as torch's AdamW (adamw_mode, the
default) or Adam, which zeroshard.initialize takes as a client optimizer and steps sharded
(with CPU Adam where the config offloads the optimizer). Alone, they step as torch's."""
import torch

from .. import _zeroshard


def _torch_class(name, amsgrad, bias_correction, adamw):
    if amsgrad:
        raise _zeroshard.Error(f"{name}(amsgrad=True): DeepSpeed's Adam kernels refuse it too; "
                               "allowed: amsgrad=False")
    if not bias_correction:
        raise _zeroshard.Error(f"{name}(bias_correction=False) is not supported: torch's and "
                               "zeroshard's Adam always correct the moments' bias; allowed: "
                               "bias_correction=True")
    return torch.optim.AdamW if adamw else torch.optim.Adam


class DeepSpeedCPUAdam(torch.optim.Optimizer):
    """deepspeed.ops.adam.DeepSpeedCPUAdam(model_params, lr, bias_correction, betas, eps,
    weight_decay, amsgrad, adamw_mode, fp32_optimizer_states): a torch AdamW (Adam with
    adamw_mode=False); every instance is one of those classes."""

    def __new__(cls, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if not fp32_optimizer_states:
            raise _zeroshard.Error("DeepSpeedCPUAdam(fp32_optimizer_states=False): zeroshard "
                                   "keeps Adam's moments in fp32; allowed: True")
        adam = _torch_class("DeepSpeedCPUAdam", amsgrad, bias_correction, adamw_mode)
        return adam(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class FusedAdam(torch.optim.Optimizer):
    """deepspeed.ops.adam.FusedAdam(params, lr, bias_correction, betas, eps, adam_w_mode,
    weight_decay, amsgrad, set_grad_none): a torch AdamW (Adam with adam_w_mode=False)."""

    def __new__(cls, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True):
        adam = _torch_class("FusedAdam", amsgrad, bias_correction, adam_w_mode)
        return adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
