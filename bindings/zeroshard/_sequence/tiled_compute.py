"""ALST's tiled compute (DeepSpeed's TiledMLP and TiledFusedLogitsLoss, by their names and
arguments): the MLP, and the logits with their loss, computed a tile of tokens at a time, so
that a long sequence's intermediate MLP width and full-vocabulary logits are never whole.

DeepSpeed runs each tile's backward inside the autograd Function (TiledMLP's backward,
TiledFusedLogitsLoss's forward), so a parameter's gradient is accumulated once per tile
and its ZeRO hooks wait for a flag (ds_grad_is_ready) set on the last one. Here the tiles'
parameter gradients are summed by the Function itself (torch.autograd.grad, nothing
accumulated in between) and handed to autograd as the gradients of the parameters, which
are the Function's inputs: each parameter's gradient arrives once per backward, as the
engine's reduction expects at every stage, and a backward run inside a forward accumulates
nothing before engine.backward begins."""
import torch


def _trainable(module, compute_params):
    """The parameters the tiles' gradients go to: those given (DeepSpeed's compute_params)
    and the module's own, each once."""
    params, seen = [], set()
    for p in list(compute_params or []) + list(module.parameters()):
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    return params


def _tile_grads(output, inputs, grad_output):
    """d output / d inputs (None where unused), without accumulating into .grad."""
    return torch.autograd.grad(output, inputs, grad_output, allow_unused=True)


def _add(total, grads):
    return [g if t is None else (t if g is None else t + g) for t, g in zip(total, grads)]


class _MLPTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, module, x, shards, *params):
        ctx.fn, ctx.module, ctx.shards, ctx.params = fn, module, shards, params
        ctx.save_for_backward(x)
        rows = x.reshape(-1, x.shape[-1])  # [batch x sequence, hidden]: one row per token
        with torch.no_grad():
            out = torch.cat([fn(module, tile) for tile in torch.chunk(rows, shards, dim=0)])
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        params = list(ctx.params)
        rows = x.detach().reshape(-1, x.shape[-1])
        grad_rows = grad.reshape(-1, grad.shape[-1])
        x_grads, param_grads = [], [None] * len(params)
        for tile, grad_tile in zip(torch.chunk(rows, ctx.shards, dim=0),
                                   torch.chunk(grad_rows, ctx.shards, dim=0)):
            tile = tile.requires_grad_(x.requires_grad)
            with torch.enable_grad():
                out = ctx.fn(ctx.module, tile)
            wrt = ([tile] if x.requires_grad else []) + params
            grads = _tile_grads(out, wrt, grad_tile)
            if x.requires_grad:
                x_grads.append(grads[0])
                grads = grads[1:]
            param_grads = _add(param_grads, grads)
        x_grad = torch.cat(x_grads).view_as(x) if x.requires_grad else None
        return (None, None, x_grad, None, *param_grads)


class TiledMLP:
    """TiledMLP.apply(fn, self, x, shards, compute_params): fn(self, tile) on `shards` tiles
    of x's tokens (x: [batch, sequence, hidden] or [tokens, hidden]), without keeping the
    MLP's intermediate activations; backward computes each tile again. The gradients of
    compute_params and of self's parameters are summed over the tiles."""

    @staticmethod
    def apply(fn, self, x, shards, compute_params=None):
        params = _trainable(self, compute_params)
        return _MLPTiles.apply(fn, self, x, int(shards), *params)


class _LossTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, module, x, y, mask, shards, output_reduction, *params):
        bs, seqlen = x.shape[:2]
        rows = x.detach().reshape(-1, *x.shape[2:])
        targets = y.reshape(-1, *y.shape[2:])
        masks = (torch.chunk(mask.reshape(-1), shards, dim=0) if mask is not None
                 else [None] * shards)
        # Each tile's output is reduced outside autograd: its share of the incoming gradient.
        scale = 1.0 / shards if output_reduction == "mean" else 1.0
        outputs, x_grads, param_grads = [], [], [None] * len(params)
        for tile, target, tile_mask in zip(torch.chunk(rows, shards, dim=0),
                                           torch.chunk(targets, shards, dim=0), masks):
            args = [module, tile.requires_grad_(x.requires_grad), target]
            if tile_mask is not None:
                args.append(tile_mask)
            with torch.enable_grad():
                out = fn(*args)
            outputs.append(out.detach())
            wrt = ([tile] if x.requires_grad else []) + list(params)
            if wrt and out.requires_grad:
                grads = _tile_grads(out, wrt, torch.full_like(out, scale))
                if x.requires_grad:
                    x_grads.append(grads[0])
                    grads = grads[1:]
                param_grads = _add(param_grads, grads)
        stacked = torch.stack(outputs)
        ctx.x_grad = torch.cat(x_grads).view(bs, seqlen, *x.shape[2:]) if x_grads else None
        ctx.param_grads = param_grads
        return stacked.mean() if output_reduction == "mean" else stacked.sum()

    @staticmethod
    def backward(ctx, grad):
        scale = lambda g: None if g is None else g * grad  # noqa: E731
        x_grad, param_grads = scale(ctx.x_grad), [scale(g) for g in ctx.param_grads]
        ctx.x_grad = ctx.param_grads = None
        return (None, None, x_grad, None, None, None, None, *param_grads)


class TiledFusedLogitsLoss:
    """TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params,
    output_reduction): fn(self, x_tile, y_tile[, mask_tile]) (the logits and their loss)
    on `shards` tiles of the tokens, each tile's logits freed before the next; the gradients
    are computed in this forward, tile by tile, and given to autograd in its backward. The
    tiles' outputs are averaged ("mean") or summed ("sum")."""

    @staticmethod
    def apply(fn, self, x, y, mask, shards, compute_params=None, output_reduction="mean"):
        if output_reduction not in ("mean", "sum"):
            raise ValueError(f'unknown reduction {output_reduction}: valid values are: '
                             '"mean"/"sum"')
        if x.dim() < 2 or y.dim() < 2:
            raise ValueError("x and y must be at least 2D [batch_size, seq_len, ...]")
        if x.shape[:2] != y.shape[:2]:
            raise ValueError("x and y batch/seq dims must match")
        if mask is not None and tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError("mask shape must match x and y batch/seq")
        params = _trainable(self, compute_params)
        return _LossTiles.apply(fn, self, x, y, mask, int(shards), output_reduction, *params)
