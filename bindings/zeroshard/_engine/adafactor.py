"""transformers' Adafactor on the shards, exactly (optim/ExternalOptimizer.h's hooks).

Adafactor is not elementwise: a matrix's second moment is factored into a row and a
column statistic (means of grad^2 + eps over each row and each column), and the update
is divided by its own RMS over the whole parameter; its lr may scale with the
parameter's RMS. A rank's shard holds pieces of parameters, so each step makes two
sums across the shard group (engine.reduce_across_shards): first every parameter's
sum of squares and its row and column sums of grad^2 + eps (each piece adds its
elements at their row and column), then every parameter's sum of squared updates.
With those, every rank applies transformers' arithmetic to its pieces.

Every rank keeps every factored parameter's row and column statistics (identical after
the sums: a few numbers per row and column), so rank 0's manifest saves them all
(optimizer_scalars, by parameter name); exp_avg (with beta1) and, for parameters that
are not factored, exp_avg_sq are per element, saved as named arrays."""
import json
import math

import torch

from .. import _zeroshard


def is_adafactor(optimizer):
    cls = type(optimizer)
    return cls.__name__ == "Adafactor" and cls.__module__.startswith("transformers")


def state_footprint(optimizer):
    """What ShardedAdafactor will hold for `optimizer`'s parameters, for the memory
    model: (bytes per trained element: exp_avg with beta1; bytes every rank holds whole:
    each matrix's row and column statistics; bytes sharded: exp_avg_sq of the
    parameters that are not factored)."""
    per_element = whole = sharded = 0
    for group in optimizer.param_groups:
        if group.get("beta1") is not None:
            per_element = 4
        for p in group["params"]:
            if not p.requires_grad:
                continue
            if p.dim() >= 2:
                lead = p.numel() // (p.shape[-2] * p.shape[-1])
                whole += 4 * lead * (p.shape[-2] + p.shape[-1])
            else:
                sharded += 4 * p.numel()
    return per_element, whole, sharded


class _Param:
    """One trainable parameter: its shape, group, step count, RMS and factored
    statistics (every rank), and this rank's pieces of it."""

    def __init__(self, name, shape, group):
        self.name, self.shape, self.group = name, tuple(shape), group
        self.numel = math.prod(self.shape)
        self.factored = len(self.shape) >= 2
        if self.factored:
            self.cols = self.shape[-1]
            self.rows = self.shape[-2]
            self.lead = self.numel // (self.rows * self.cols)
        self.step, self.rms = 0, 0.0
        self.row = self.col = None
        self.pieces = []  # (flat group, begin, count, param_offset)


class ShardedAdafactor:
    """The hooks' owner for a transformers Adafactor client (bindings/PyOptimizerHooks.h)."""

    def __init__(self, core, client, named_params):
        self._core, self._client = core, client
        group_of = {id(p): g for g, group in enumerate(client.param_groups)
                    for p in group["params"]}
        by_name = dict(named_params)
        self._masters, self._params = [], {}
        for i, (master, _, pieces) in enumerate(core.optimizer_shards()):
            self._masters.append(master)
            for begin, count, index, offset, shape, name in pieces:
                if index not in self._params:
                    self._params[index] = _Param(name, shape, group_of[id(by_name[name])])
                if count:
                    self._params[index].pieces.append((i, begin, count, offset))
        self._order = [self._params[k] for k in sorted(self._params)]
        self._exp_avg, self._exp_avg_sq = {}, {}  # (flat group, begin) -> this rank's piece
        self._device = self._masters[0].device if self._masters else torch.device("cpu")
        self._row_col = {}  # (flat group, begin) -> each element's row and column index
        for p in self._order:
            if p.factored:
                p.row = torch.zeros(p.lead * p.rows, dtype=torch.float32)
                p.col = torch.zeros(p.lead * p.cols, dtype=torch.float32)
                for i, begin, count, offset in p.pieces:
                    self._row_col[(i, begin)] = self._indices(p, offset, count)

    # --- the step
    def _options(self, p, lrs):
        g = dict(self._client.param_groups[p.group])
        if not g["relative_step"]:
            g["lr"] = lrs[p.group]
        return g

    def _reduced(self, sizes, fill):
        """A float64 buffer of sum(sizes) numbers, filled per parameter by fill(p, view),
        summed across the shards."""
        buffer = torch.zeros(sum(sizes), dtype=torch.float64, device=self._device)
        at = 0
        for p, size in zip(self._order, sizes):
            fill(p, buffer.narrow(0, at, size))
            at += size
        self._core.reduce_across_shards(buffer)
        return buffer.cpu()

    def _indices(self, p, offset, count):
        idx = torch.arange(offset, offset + count, device=self._device)
        row = idx // p.cols
        col = (idx // (p.rows * p.cols)) * p.cols + idx % p.cols
        return row, col

    def step(self, grads, lrs):
        groups = [self._options(p, lrs) for p in self._order]

        def first(p, out):  # [sum w^2, row sums, column sums]
            eps1 = self._client.param_groups[p.group]["eps"][0]
            for i, begin, count, _ in p.pieces:
                w = self._masters[i].narrow(0, begin, count)
                out[0] += w.double().square().sum()
                if p.factored:
                    sq = grads[i].narrow(0, begin, count).square() + eps1
                    row, col = self._row_col[(i, begin)]
                    out.narrow(0, 1, p.row.numel()).index_add_(0, row, sq.double())
                    out.narrow(0, 1 + p.row.numel(), p.col.numel()).index_add_(0, col, sq.double())

        sizes = [1 + ((p.row.numel() + p.col.numel()) if p.factored else 0) for p in self._order]
        sums = self._reduced(sizes, first)
        at, updates, lrs_now = 0, {}, []
        for p, g, size in zip(self._order, groups, sizes):
            p.step += 1
            p.rms = math.sqrt(sums[at].item()) / math.sqrt(p.numel)
            lrs_now.append(self._lr(g, p))
            beta2t = 1.0 - math.pow(p.step, g["decay_rate"])
            if p.factored:
                row_mean = (sums.narrow(0, at + 1, p.row.numel()) / p.cols).float()
                col_mean = (sums.narrow(0, at + 1 + p.row.numel(), p.col.numel()) / p.rows).float()
                p.row.mul_(beta2t).add_(row_mean, alpha=1.0 - beta2t)
                p.col.mul_(beta2t).add_(col_mean, alpha=1.0 - beta2t)
            at += size
            updates[p.name] = self._updates(p, g, beta2t, grads)

        def second(p, out):  # sum of squared updates
            for u in updates[p.name]:
                out[0] += u.double().square().sum()

        squares = self._reduced([1] * len(self._order), second)
        for k, (p, g) in enumerate(zip(self._order, groups)):
            rms = math.sqrt(squares[k].item()) / math.sqrt(p.numel)
            self._apply(p, g, lrs_now[k], max(rms / g["clip_threshold"], 1.0), updates[p.name])

    @staticmethod
    def _lr(g, p):
        rel = g["lr"]
        if g["relative_step"]:
            least = 1e-6 * p.step if g["warmup_init"] else 1e-2
            rel = min(least, 1.0 / math.sqrt(p.step))
        scale = max(g["eps"][1], p.rms) if g["scale_parameter"] else 1.0
        return scale * rel

    def _updates(self, p, g, beta2t, grads):
        out = []
        if p.factored:
            row_mean = p.row.view(p.lead, p.rows).mean(dim=-1)
            r_factor = (p.row / row_mean.repeat_interleave(p.rows)).rsqrt().to(self._device)
            c_factor = p.col.rsqrt().to(self._device)
        for i, begin, count, _ in p.pieces:
            grad = grads[i].narrow(0, begin, count)
            if p.factored:
                row, col = self._row_col[(i, begin)]
                out.append((r_factor[row] * c_factor[col]) * grad)
            else:
                v = self._exp_avg_sq.setdefault((i, begin), torch.zeros_like(grad))
                v.mul_(beta2t).add_(grad.square() + g["eps"][0], alpha=1.0 - beta2t)
                out.append(v.rsqrt() * grad)
        return out

    def _apply(self, p, g, lr, clip, updates):
        for (i, begin, count, _), u in zip(p.pieces, updates):
            u.div_(clip).mul_(lr)
            if g["beta1"] is not None:
                m = self._exp_avg.setdefault((i, begin), torch.zeros_like(u))
                m.mul_(g["beta1"]).add_(u, alpha=1 - g["beta1"])
                u = m
            w = self._masters[i].narrow(0, begin, count)
            if g["weight_decay"] != 0:
                w.add_(w, alpha=-g["weight_decay"] * lr)
            w.add_(-u)

    # --- checkpoints (engine/Checkpoint.h)
    def state_names(self):
        return ["exp_avg", "exp_avg_sq"]

    def _each_piece(self, group):
        for p in self._order:
            for i, begin, count, _ in p.pieces:
                if i == group:
                    yield begin, count

    def read_state(self, group, arrays):
        for begin, count in self._each_piece(group):
            for table, out in zip((self._exp_avg, self._exp_avg_sq), arrays):
                piece = out.narrow(0, begin, count)
                if (group, begin) in table:
                    piece.copy_(table[(group, begin)])
                else:
                    piece.zero_()

    def write_state(self, group, arrays):
        for begin, count in self._each_piece(group):
            for table, saved in zip((self._exp_avg, self._exp_avg_sq), arrays):
                table[(group, begin)] = saved.narrow(0, begin, count).to(self._device, copy=True)

    def scalar_state(self):
        return json.dumps({"adafactor": {p.name: {
            "step": p.step, "RMS": p.rms,
            "row": p.row.tolist() if p.factored else None,
            "col": p.col.tolist() if p.factored else None} for p in self._order}})

    def set_scalar_state(self, text, steps):
        saved = json.loads(text)
        if steps == 0:
            return
        if not isinstance(saved, dict) or "adafactor" not in saved:
            raise _zeroshard.Error("the checkpoint holds no Adafactor statistics (row and column "
                                   "second moments); resume with the optimizer it was saved with")
        for p in self._order:
            s = saved["adafactor"][p.name]
            p.step, p.rms = s["step"], s["RMS"]
            if p.factored:
                p.row = torch.tensor(s["row"], dtype=torch.float32)
                p.col = torch.tensor(s["col"], dtype=torch.float32)

    def state_bytes(self):
        held = sum(t.nbytes for table in (self._exp_avg, self._exp_avg_sq) for t in table.values())
        return held + sum(p.row.nbytes + p.col.nbytes for p in self._order if p.factored)
