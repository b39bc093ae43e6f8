"""The optimizer initialize() returns, and where its parameter groups come from.

Groups come from DeepSpeed's `model_parameters` (tensors, or dicts holding "params" and
hyperparameters) or from a client torch.optim.Adam/AdamW, whose groups and
hyperparameters are read and whose stepping the sharded optimizer takes over.
ZeroShardOptimizer is a torch.optim.Optimizer so that torch's LR schedulers drive it:
they write param_groups[i]["lr"], and the engine reads every group before each step.
With a client optimizer its own group dicts are the ones shown and read, so a
scheduler built on it works unchanged."""
import torch

from . import torch_optimizer as _torch_optimizer
from .. import _zeroshard

# bias_correction: DeepSpeed's Adam classes keep it per group (their groups only).
HYPER_KEYS = ("lr", "betas", "eps", "weight_decay", "bias_correction")
# Keys of torch's Adam/AdamW groups that choose an implementation or are the
# scheduler's bookkeeping: the sharded optimizer has its own implementation.
_IMPLEMENTATION_KEYS = {"foreach", "fused", "capturable", "initial_lr", "decoupled_weight_decay"}
# Options of torch's Adam/AdamW the sharded optimizer does not have: refused when on.
_UNSUPPORTED_FLAGS = ("amsgrad", "maximize", "differentiable")
# Hyperparameters of other torch optimizers: a group carrying one was meant for another.
_OTHER_OPTIMIZERS_KEYS = {"momentum", "dampening", "nesterov", "lr_decay", "rho", "alpha",
                          "centered", "lambd", "momentum_decay", "etas", "step_sizes"}


def _error(message):
    return _zeroshard.Error(message)


def _check_group(where, group):
    for flag in _UNSUPPORTED_FLAGS:
        if group.get(flag):
            raise _error(f"{where}: {flag}=True is not supported; allowed: {flag}=False "
                         "(the sharded optimizer is Adam/AdamW without it)")
    other = sorted(_OTHER_OPTIMIZERS_KEYS & set(group))
    if other:
        raise _error(f"{where}: key '{other[0]}' belongs to another optimizer; allowed keys: "
                     f"params, {', '.join(HYPER_KEYS)}")
    betas = group.get("betas")
    if betas is not None and (not isinstance(betas, (tuple, list)) or len(betas) != 2):
        raise _error(f"{where}.betas: {betas!r} is not allowed; allowed: a pair (beta1, beta2)")


def _groups_from_model_parameters(model_parameters):
    items = list(model_parameters)
    if all(isinstance(p, torch.Tensor) for p in items):
        return [{"params": items}]
    if all(isinstance(g, dict) for g in items):
        groups = []
        for i, g in enumerate(items):
            if "params" not in g:
                raise _error(f"model_parameters[{i}]: a group without 'params'; allowed: "
                             "{'params': [...], 'lr': ..., 'weight_decay': ..., 'betas': ..., "
                             "'eps': ...}")
            _check_group(f"model_parameters[{i}]", g)
            params = g["params"]
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            groups.append(dict(g, params=params))
        return groups
    kinds = sorted({type(p).__name__ for p in items})
    raise _error(f"model_parameters: a mix of {', '.join(kinds)}; allowed: tensors (one group) "
                 "or dicts with 'params' (parameter groups)")


def _client_groups(optimizer, model_parameters):
    _torch_optimizer.check_class(optimizer)
    builtin = _torch_optimizer.is_builtin(optimizer)
    for i, g in enumerate(optimizer.param_groups):
        if builtin:
            _check_group(f"optimizer.param_groups[{i}]", g)
    if model_parameters is not None:
        given = {id(p) for g in _groups_from_model_parameters(model_parameters)
                 for p in g["params"]}
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if given != held:
            raise _error("model_parameters and optimizer name different parameters "
                         f"({len(given)} vs {len(held)}); pass one of them, the optimizer's "
                         "groups are what is trained")
    if not builtin:  # its own class steps it (bindings/zeroshard/_engine/torch_optimizer.py)
        return optimizer.param_groups, [None] * len(optimizer.param_groups)
    decoupled = _torch_optimizer.decoupled_decay(optimizer)
    return optimizer.param_groups, [decoupled or bool(g.get("decoupled_weight_decay"))
                                    for g in optimizer.param_groups]


def parameter_groups(model, model_parameters, optimizer):
    """(client optimizer or None, groups, decoupled): the group dicts (a client
    optimizer's own), and per group whether weight decay is decoupled (None: the
    config's optimizer type decides)."""
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise _error(f"optimizer: a {type(optimizer).__name__}; allowed: a torch.optim "
                         "optimizer, or a callable that makes one from the model parameters")
        params = model_parameters if model_parameters is not None else model.parameters()
        optimizer, model_parameters = optimizer(params), None  # DeepSpeed's callable form
    if optimizer is not None:
        return (optimizer,) + _client_groups(optimizer, model_parameters)
    if model_parameters is None:
        groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    else:
        groups = _groups_from_model_parameters(model_parameters)
    return None, groups, [None] * len(groups)


def refuse_twice_named(loaded, optimizer, lr_scheduler):
    """DeepSpeed's rule, said as an error: the optimizer and the scheduler come from the
    config or from the client, never both."""
    keys, origin = loaded.top_level_keys, loaded.origin
    for given, key, arg in ((optimizer, "optimizer", "optimizer"),
                            (lr_scheduler, "scheduler", "lr_scheduler")):
        if given is not None and key in keys:
            raise _zeroshard.Error(
                f"{arg}: given to initialize() and as '{key}' in {origin}; one of them must go "
                f"(remove the config's '{key}' section to use the client's)")


def client_scheduler(scheduler, optimizer, client_optimizer):
    """DeepSpeed's lr_scheduler argument: a scheduler built on the client optimizer, or
    a callable that builds one from the optimizer initialize() returns."""
    if scheduler is None:
        return None
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise _error("lr_scheduler: ReduceLROnPlateau steps on a metric the engine does not "
                     "have; keep it outside and call its step(metric) yourself")
    if hasattr(scheduler, "step") and not isinstance(scheduler, type):
        bound = getattr(scheduler, "optimizer", None)
        if bound is not None and bound is not client_optimizer:
            raise _error("lr_scheduler: it is bound to an optimizer that initialize() was not "
                         "given; build it on the optimizer you pass as optimizer=, or pass a "
                         "callable that takes the optimizer and returns the scheduler")
        return scheduler
    if callable(scheduler):
        made = scheduler(optimizer)
        if not hasattr(made, "step"):
            raise _error(f"lr_scheduler: the callable returned a {type(made).__name__}, which "
                         "has no step(); allowed: a callable returning an LR scheduler")
        return made
    raise _error(f"lr_scheduler: a {type(scheduler).__name__}; allowed: an LR scheduler on the "
                 "client optimizer, or a callable taking the optimizer")


def engine_options(group, decoupled, keys=HYPER_KEYS):
    """What the C++ engine takes of a group: its hyperparameters (`keys`: only lr for a
    torch.optim class the package steps, which reads the rest from the group itself)."""
    out = {k: group[k] for k in keys if group.get(k) is not None}
    if "betas" in out:
        out["betas"] = tuple(float(b) for b in out["betas"])
    if decoupled is not None:
        out["decoupled"] = decoupled
    return out


class ZeroShardOptimizer(torch.optim.Optimizer):
    """The sharded optimizer, as a torch Optimizer: param_groups are the real groups,
    and setting a group's lr, betas, eps or weight_decay (any option of a torch.optim
    class the package steps) takes effect at the next step.
    Stepping belongs to the engine (engine.step())."""

    def __init__(self, core, zero_grad, groups, decoupled, keys=HYPER_KEYS):
        """core: the C++ engine, which holds each group's hyperparameters; zero_grad: the
        ZeroShardEngine's; keys: the hyperparameters the engine holds (only lr where a
        torch.optim class steps, its groups holding the rest)."""
        hypers = core.param_group_hypers()
        defaults = {k: v for k, v in hypers[0].items() if k in keys}
        super().__init__([{"params": g["params"]} for g in groups], defaults)
        self.param_groups = groups  # a client optimizer's own dicts, shared
        for g, h in zip(groups, hypers):
            for key in keys:
                if g.get(key) is None:
                    g[key] = h[key]
        self._core = core
        self._zero_grad = zero_grad
        self._decoupled = decoupled
        self._keys = keys
        self._pushed = [self._options(g, d) for g, d in zip(groups, decoupled)]

    def _options(self, group, decoupled):
        return engine_options(group, decoupled, self._keys)

    def push_groups(self):
        """Hands changed groups to the engine; called by the engine before each step."""
        if len(self.param_groups) != len(self._pushed):
            raise _error(f"optimizer.param_groups: {len(self.param_groups)} groups, the engine "
                         f"was built with {len(self._pushed)}; groups cannot be added after "
                         "initialize")
        for i, (g, d) in enumerate(zip(self.param_groups, self._decoupled)):
            options = self._options(g, d)
            if options != self._pushed[i]:
                self._core.set_param_group(i, options)
                self._pushed[i] = options

    def pull_groups(self):
        """After a checkpoint load: every group's hyperparameters as the checkpoint
        restored them in the engine."""
        for g, h in zip(self.param_groups, self._core.param_group_hypers()):
            for key in self._keys:
                g[key] = h[key]
        self._pushed = [self._options(g, d) for g, d in zip(self.param_groups, self._decoupled)]

    def show_scheduled_lr(self):
        """Under a config scheduler: its lr (and OneCycle's betas, where it cycles them)
        into every group, for the next step."""
        for g, h in zip(self.param_groups, self._core.param_group_hypers()):
            g["lr"] = h["lr"]
            if "betas" in g and "betas" in self._keys:
                g["betas"] = tuple(h["betas"])
        self._pushed = [self._options(g, d) for g, d in zip(self.param_groups, self._decoupled)]

    @property
    def cur_scale(self):
        """fp16's loss scale now (1 without fp16), under DeepSpeed's optimizers' name."""
        return self._core.loss_scale

    loss_scale = cur_scale

    # Set by zeroshard.integrations.ZeroShardTrainer, whose training_step already ran
    # engine.step(): the Trainer's own optimizer.step() call then does nothing.
    stepped_by_engine = False

    def step(self, closure=None):
        if self.stepped_by_engine:
            return None
        raise _error("call engine.step(), not optimizer.step(): the engine steps the sharded "
                     "optimizer at each accumulation boundary")

    def zero_grad(self, set_to_none=True):
        self._zero_grad()

    def state_dict(self):
        raise _error("optimizer.state_dict(): the optimizer state is sharded across ranks; "
                     "save it with engine.save_checkpoint(dir)")

    def load_state_dict(self, state_dict):
        raise _error("optimizer.load_state_dict(): the optimizer state is sharded across ranks; "
                     "load it with engine.load_checkpoint(dir)")
