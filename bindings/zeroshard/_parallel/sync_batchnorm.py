"""SyncBatchNorm under the engine: statistics over every rank's batch, on any device.

torch's SyncBatchNorm synchronises only when torch.distributed is initialised and refuses
host tensors ("expected input tensor to be on GPU"), so on its own it cannot run on the
host, nor under a zeroshard job that never started torch.distributed. take_over() gives
each SyncBatchNorm of the model a forward of its own (the module keeps its class as a
base, its parameters, buffers and state_dict), and starts torch.distributed at the
launch's rendezvous when the script has not, before the engine joins the same store.

The arithmetic is torch's: the batch's mean and biased variance over all ranks normalise
the input; the running variance takes the unbiased one over the total count; in
backward the sums of dy and dy*(x - mean) are summed over ranks, while the weight's and
bias's gradients stay this rank's (the engine averages them as it averages every
gradient). Statistics travel as one float64 all-reduce of (count, sum, sum of squares)
per layer, from each rank's own float32 mean and variance, so no precision is lost to
the subtraction of large sums. Collectives use the module's process_group, or
torch.distributed's default group: the one the user set up.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._common import launch as _launch

_classes = {}  # SyncBatchNorm class -> its engine subclass


def take_over(model):
    """Every SyncBatchNorm in `model` synchronises through torch.distributed on any device."""
    found = [m for m in model.modules() if isinstance(m, torch.nn.SyncBatchNorm)]
    if not found:
        return
    _launch.init_distributed()
    for module in found:
        base = type(module)
        if issubclass(base, _EngineSyncBatchNorm):
            continue  # an engine built before this one took it over
        cls = _classes.get(base)
        if cls is None:
            cls = _classes[base] = type(f"ZeroShard{base.__name__}", (_EngineSyncBatchNorm, base), {})
        module.__class__ = cls


class _EngineSyncBatchNorm(torch.nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm.forward, with the synchronised case done by _SyncBatchNorm."""

    def forward(self, input):
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative average
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep else None
        running_var = self.running_var if keep else None
        group = self.process_group or dist.group.WORLD
        if not (use_batch and self.training and dist.get_world_size(group) > 1):
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                use_batch, factor, self.eps)
        return _SyncBatchNorm.apply(input, self.weight, self.bias, running_mean, running_var,
                                    self.eps, factor, group)


def _channel_shape(x):
    return (1, -1) + (1,) * (x.dim() - 2)


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor, group):
        dims = [0] + list(range(2, x.dim()))
        xf = x.float()
        count = xf.numel() // xf.shape[1]
        channels = xf.shape[1]
        if count > 0:
            var, mean = torch.var_mean(xf, dim=dims, unbiased=False)
        else:
            var = mean = torch.zeros(channels, device=x.device)
        stats = torch.cat([torch.full((1,), float(count), device=x.device, dtype=torch.float64),
                           count * mean.double(), count * (var.double() + mean.double() ** 2)])
        dist.all_reduce(stats, group=group)
        total = stats[0]
        mean64 = stats[1:channels + 1] / total
        var64 = (stats[channels + 1:] / total - mean64 ** 2).clamp_(min=0)
        mean, var = mean64.float(), var64.float()
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - factor).add_(factor * mean.to(running_mean.dtype))
                unbiased = var64 * (total / (total - 1)) if total > 1 else var64
                running_var.mul_(1 - factor).add_(factor * unbiased.to(running_var.dtype))
        shape = _channel_shape(xf)
        y = (xf - mean.view(shape)) * invstd.view(shape)
        if weight is not None:
            y = y * weight.float().view(shape)
        if bias is not None:
            y = y + bias.float().view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total, ctx.group = float(total), group
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        dims = [0] + list(range(2, x.dim()))
        shape = _channel_shape(x)
        dyf = dy.float()
        xmu = x.float() - mean.view(shape)
        sum_dy = dyf.sum(dims)
        sum_dy_xmu = (dyf * xmu).sum(dims)
        grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if weight is not None else None
        grad_bias = sum_dy.to(ctx.bias_dtype) if ctx.bias_dtype is not None else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            sums = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(sums, group=ctx.group)
            channels = mean.numel()
            mean_dy = (sums[:channels] / ctx.total).view(shape)
            mean_dy_xmu = (sums[channels:] / ctx.total).view(shape)
            istd = invstd.view(shape)
            scale = istd * weight.float().view(shape) if weight is not None else istd
            grad_x = (dyf - mean_dy - xmu * istd ** 2 * mean_dy_xmu) * scale
            grad_x = grad_x.to(x.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None
