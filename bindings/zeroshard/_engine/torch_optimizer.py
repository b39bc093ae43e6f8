"""Any elementwise torch.optim class on this rank's shards (optim/ExternalOptimizer.h).

The client's optimizer class (or the config's optimizer.type, a torch.optim class name,
as DeepSpeed takes it) is built a second time, over views of this rank's fp32 master
shards: each parameter group's piece of each flat shard is one tensor of that group.
An elementwise update (SGD, Adagrad, RMSprop, Adamax, NAdam, RAdam, Adam with amsgrad,
a client's Lion, ...) gives every element what it gives it in the whole parameter, so
training matches DDP with the same optimizer. The engine hands it the reduced, scaled
gradients and writes the updated masters back to the parameters.

What the class keeps per element (state tensors shaped like the parameter) is read by
a probe: the class stepped once on a two-element tensor with each group's options. The
names are then the same on every rank from the first step, which checkpoints need
(arrays named as torch names them, resharded like the parameters); the rest of the
state (torch's per-parameter step counts, NAdam's mu_product) is the same for every
parameter of a group and is saved per group.

With offload_optimizer.device nvme the engine keeps the per-element state in swap
regions (sub-groups of each shard) and streams them through pinned buffers; the class is
then built over views cut at the regions' edges too, and step_region steps one region's
views with their state bound to the region's buffer, which the class updates in place
(a copy where it makes a new tensor), keeping only the scalars afterwards."""
import json

import torch

from . import adafactor as _adafactor
from .. import _zeroshard

# zeroshard's own optimizer: these classes without the options it lacks.
_BUILTIN = (torch.optim.AdamW, torch.optim.Adam)
_BUILTIN_LACKS = ("amsgrad", "maximize")
# Classes whose update needs a whole parameter, not the elementwise view a shard gives.
_LAMB = ("scales each parameter's update by norms of the whole parameter; name it in the "
         "config instead (optimizer.type Lamb: zeroshard's Lamb sums the norms across shards)")
_WHOLE_TENSOR = {"LBFGS": "steps with a closure over whole parameters",
                 "SparseAdam": "steps sparse gradients; zeroshard's gradients are dense",
                 "Muon": "orthogonalises each whole matrix update",
                 "Shampoo": "preconditions each whole matrix",
                 "Adafactor": "factors each matrix's second moment by its rows and columns "
                              "(transformers' Adafactor is stepped exactly: pass that one)",
                 "FusedLamb": _LAMB, "FusedLAMB": _LAMB, "Lamb": _LAMB, "LAMB": _LAMB,
                 "LARS": "scales each parameter's update by norms of the whole parameter",
                 "Lars": "scales each parameter's update by norms of the whole parameter",
                 "NovoGrad": "normalises by each whole parameter's gradient norm"}


# DeepSpeed's own Adam classes, which scripts build themselves (DeepSpeed-Chat takes
# DeepSpeedCPUAdam when it offloads, FusedAdam when not): the update of zeroshard's Adam
# (adam_w_mode: AdamW's decoupled decay, else Adam's L2), so zeroshard's own steps them,
# wherever the state lives (DeepSpeedCPUAdam itself needs it on the host, FusedAdam on
# the GPU).
_DEEPSPEED_ADAM = ("deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam",
                   "deepspeed.ops.adam.fused_adam.FusedAdam")


def _error(message):
    return _zeroshard.Error(message)


def _class_path(optimizer):
    return f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"


def deepspeed_adam(optimizer):
    """Whether `optimizer` is one of DeepSpeed's Adam classes; refuses what zeroshard's
    Adam does not do."""
    if _class_path(optimizer) not in _DEEPSPEED_ADAM:
        return False
    name = type(optimizer).__name__
    if getattr(optimizer, "fp32_optimizer_states", True) is False:
        raise _error(f"optimizer: {name}(fp32_optimizer_states=False) keeps Adam's moments in "
                     "16 bits; zeroshard keeps them in fp32; allowed: fp32_optimizer_states=True")
    return True


def decoupled_decay(optimizer):
    """Whether the built-in Adam class `optimizer` decouples weight decay (AdamW)."""
    if deepspeed_adam(optimizer):
        return bool(optimizer.adam_w_mode)
    return isinstance(optimizer, torch.optim.AdamW)


def is_builtin(optimizer):
    """Whether zeroshard's own Adam/AdamW steps `optimizer` (a torch.optim object)."""
    return ((type(optimizer) in _BUILTIN or deepspeed_adam(optimizer)) and
            not any(g.get(k) for g in optimizer.param_groups for k in _BUILTIN_LACKS))


def check_class(optimizer):
    """Refuses a class whose update is not elementwise, naming why."""
    name = type(optimizer).__name__
    if name in _WHOLE_TENSOR and not _adafactor.is_adafactor(optimizer):
        raise _error(f"optimizer: {type(optimizer).__module__}.{name} {_WHOLE_TENSOR[name]}, "
                     "which a shard does not hold; allowed: an optimizer whose update is "
                     "elementwise (SGD, Adagrad, RMSprop, Adam, AdamW, Adamax, NAdam, RAdam, ...)")
    if any(g.get("differentiable") for g in optimizer.param_groups):
        raise _error(f"optimizer: {name}(differentiable=True) is not supported; allowed: "
                     "differentiable=False (the engine steps the shards outside autograd)")
    if any(_has_stepped(s) for s in optimizer.state.values()):
        raise _error(f"optimizer: this {name} has already stepped (it holds state for "
                     f"{len(optimizer.state)} tensors, which would be lost); pass a fresh one, "
                     "or resume with engine.load_checkpoint")


def _yaml_scalar(text):
    """A param as the config loader kept it (YAML flow text): numbers, booleans and lists
    read as JSON does; anything else is the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return {"True": True, "False": False, "None": None, "null": None}.get(text, text)


def _has_stepped(state):
    """Whether one parameter's state shows a step (Adagrad makes its state, at step 0,
    in its constructor)."""
    step = state.get("step")
    return bool(state) and (step is None or float(step) > 0)


def from_config(loaded, groups):
    """A torch.optim object of the config's optimizer section over `groups` (dicts with
    'params'), or None where it names zeroshard's own Adam/AdamW (or is absent)."""
    named, origin = loaded.torch_optimizer, loaded.origin
    if named is None:
        return None
    name, raw = named
    cls = getattr(torch.optim, name)  # the config loader took only torch.optim's names
    params = {k: _yaml_scalar(v) for k, v in raw.items()}
    try:
        return cls([dict(g) for g in groups], **params)
    except (TypeError, ValueError) as e:
        import inspect
        taken = [p for p in inspect.signature(cls).parameters if p != "params"]
        raise _error(f"{origin}: config key 'optimizer.params' {params} is not allowed for "
                     f"torch.optim.{name}: {e}; allowed: {', '.join(taken)}") from None


def _construct(cls, groups, defaults):
    """cls over `groups` with the client's constructor arguments (its defaults): some
    classes read an argument only there (Adagrad's initial_accumulator_value fills its
    state in the constructor)."""
    try:
        return cls(groups, **defaults)
    except TypeError:  # defaults that are not constructor arguments
        return cls(groups)


def _probe(cls, options, defaults):
    """(per-element state names, scalar state names, bytes per element) of `cls` with
    one group's `options`, from one step on a two-element tensor on the host (where
    the implementation choices, which name no state, are left to torch)."""
    p = torch.zeros(2, requires_grad=True)
    p.grad = torch.full((2,), 0.5)
    chosen = ("foreach", "fused", "capturable")
    options = {k: v for k, v in options.items() if k not in chosen}
    opt = _construct(cls, [dict(options, params=[p])],
                     {k: v for k, v in defaults.items() if k not in chosen})
    opt.step()
    arrays, scalars, nbytes = [], [], 0
    for key, value in opt.state[p].items():
        if isinstance(value, torch.Tensor) and value.shape == p.shape:
            arrays.append(key)
            nbytes += value.element_size()
        else:
            scalars.append(key)
    return arrays, scalars, nbytes


def _cut(spans, edges):
    """`spans` ((begin, count, param group)) cut at the element offsets `edges`."""
    for begin, count, g in spans:
        end = begin + count
        for edge in sorted(e for e in edges if begin < e < end):
            yield begin, edge - begin, g
            begin = edge
        yield begin, end - begin, g


def _options(group):
    return {k: v for k, v in group.items() if k != "params"}


def state_bytes_per_element(optimizer):
    """Bytes per trained element of `optimizer`'s state: the largest group's."""
    return max(_probe(type(optimizer), _options(g), optimizer.defaults)[2]
               for g in optimizer.param_groups)


def _scalar_json(value):
    if isinstance(value, torch.Tensor):
        return {"value": value.item(), "dtype": str(value.dtype).replace("torch.", ""),
                "on_param_device": value.device.type != "cpu"}
    return {"value": value}


def _scalar_value(saved, device):
    if "dtype" not in saved:
        return saved["value"]
    where = device if saved.get("on_param_device") else "cpu"
    return torch.tensor(saved["value"], dtype=getattr(torch, saved["dtype"]), device=where)


class TorchShardOptimizer:
    """`client`'s class over this rank's shards; the C++ engine calls the methods below
    (bindings/PyOptimizerHooks.h)."""

    def __init__(self, core, client):
        self._client = client
        self._cls = type(client)
        shards = core.optimizer_shards()
        regions = core.optimizer_regions()
        n_groups = len(client.param_groups)
        self._spans = []  # per flat group: [(begin, count, param group, view)]
        self._regions = [[] for _ in regions]  # per swap region: [(its offset, piece)]
        members = [[] for _ in range(n_groups)]
        for i, (master, spans, _) in enumerate(shards):
            pieces = []
            edges = [(r, off, off + n) for r, (grp, off, n) in enumerate(regions) if grp == i]
            for begin, count, g in _cut(spans, [e[2] for e in edges]):
                view = master.narrow(0, begin, count)
                pieces.append((begin, count, g, view))
                members[g].append(view)
                for r, start, end in edges:
                    if start <= begin < end:
                        self._regions[r].append((begin - start, pieces[-1]))
            self._spans.append(pieces)
        self._swapped = False  # the engine keeps the per-element state (NVMe)
        self._held = {}  # with it: id(view) -> the names its region holds for it
        self._opt = _construct(self._cls, [dict(_options(g), params=members[i])
                                           for i, g in enumerate(client.param_groups)],
                               client.defaults)
        probes = [_probe(self._cls, _options(g), client.defaults) for g in client.param_groups]
        self._group_arrays = [p[0] for p in probes]
        self._group_scalars = [p[1] for p in probes]
        self._names = []
        for arrays in self._group_arrays:
            self._names += [a for a in arrays if a not in self._names]
        self._scalars = [None] * n_groups  # restored per group, set before write_state

    def _sync_options(self, lrs):
        """The client's group options (a scheduler or the user may change them) and the
        engine's lr of each group (a config scheduler's)."""
        for client, mine, lr in zip(self._client.param_groups, self._opt.param_groups, lrs):
            for key, value in client.items():
                if key != "params":
                    mine[key] = value
            mine["lr"] = lr

    def step(self, grads, lrs):
        self._sync_options(lrs)
        for pieces, grad in zip(self._spans, grads):
            for begin, count, _, view in pieces:
                view.grad = grad.narrow(0, begin, count)
        try:
            self._opt.step()
        finally:
            for pieces in self._spans:
                for *_, view in pieces:
                    view.grad = None

    def step_region(self, region, grad, lrs, arrays):
        """One swap region's pieces, their state bound to the region's `arrays`."""
        self._sync_options(lrs)
        pieces = self._regions[region]
        for at, (begin, count, _, view) in pieces:
            state, held = self._opt.state[view], self._held.get(id(view), ())
            for name, array in zip(self._names, arrays):
                if name in held:
                    state[name] = array.narrow(0, at, count)
            view.grad = grad.narrow(0, begin, count)
        try:
            self._opt.step()
        finally:
            for _, (*_, view) in pieces:
                view.grad = None
        for at, (_, count, _, view) in pieces:
            self._drop(view, [a.narrow(0, at, count) for a in arrays])

    def _drop(self, view, arrays=None):
        """Forgets `view`'s per-element state, keeping the scalars, after moving it into
        `arrays` where the class made tensors of its own (a first step)."""
        state = self._opt.state.get(view, {})
        held = set()
        for i, name in enumerate(self._names):
            if name in state:
                if arrays is not None and state[name].data_ptr() != arrays[i].data_ptr():
                    arrays[i].copy_(state[name])
                del state[name]
                held.add(name)
        self._held[id(view)] = held

    def release_state(self):
        """From now on the engine keeps the per-element state (read_state gave it)."""
        for pieces in self._spans:
            for *_, view in pieces:
                self._drop(view)
        self._swapped = True

    def state_names(self):
        return list(self._names)

    def read_state(self, group, arrays):
        if self._swapped:
            raise RuntimeError("read_state: the engine keeps the state (NVMe)")
        for begin, count, _, view in self._spans[group]:
            state = self._opt.state.get(view, {})
            for name, out in zip(self._names, arrays):
                piece = out.narrow(0, begin, count)
                if name in state:
                    piece.copy_(state[name])
                else:
                    piece.zero_()

    def write_state(self, group, arrays):
        for begin, count, g, view in self._spans[group]:
            if self._scalars[g] is None:  # saved before the first step: as constructed
                continue
            state = self._opt.state[view]
            state.clear()
            if self._swapped:  # the engine has written the arrays to the regions
                self._held[id(view)] = set(self._group_arrays[g])
            for name, saved in zip(self._names, arrays):
                if name in self._group_arrays[g] and not self._swapped:
                    state[name] = saved.narrow(0, begin, count).to(view.device, copy=True)
            for key, saved in (self._scalars[g] or {}).items():
                state[key] = _scalar_value(saved, view.device)

    def scalar_state(self):
        """Each parameter group's scalar state, from its first piece on this rank."""
        groups = [None] * len(self._opt.param_groups)
        for pieces in self._spans:
            for _, _, g, view in pieces:
                state = self._opt.state.get(view)
                if groups[g] is None and state:
                    groups[g] = {k: _scalar_json(v) for k, v in state.items()
                                 if k not in self._group_arrays[g]}
        return json.dumps({"groups": groups})

    def set_scalar_state(self, text, steps):
        """Before write_state: the saved scalars, or where a group has none (a checkpoint
        of zeroshard's Adam, a group absent from the saving rank's shard) the step count."""
        saved = json.loads(text)
        groups = saved.get("groups") if isinstance(saved, dict) else None
        self._scalars = [None] * len(self._opt.param_groups)
        if steps == 0:
            return
        for g, needed in enumerate(self._group_scalars):
            if groups and g < len(groups) and groups[g] is not None:
                self._scalars[g] = groups[g]
                continue
            lacking = [k for k in needed if k != "step"]
            if lacking:
                raise _error(f"the checkpoint holds no {', '.join(lacking)} for parameter group "
                             f"{g}, which {self._cls.__name__} keeps; resume with the optimizer "
                             "the checkpoint was saved with")
            step = {"value": float(steps), "dtype": "float32"}
            self._scalars[g] = {"step": step} if "step" in needed else {}

    def state_bytes(self):
        return sum(v.nbytes for s in self._opt.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor) and v.dim() > 0)
