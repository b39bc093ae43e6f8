"""deepspeed.checkpointing's API (Megatron-DeepSpeed calls it): activation checkpointing
with every activation_checkpointing key honoured.

checkpoint(function, *args) runs `function` without keeping its inner activations and
recomputes them in backward. Its floating-point tensor inputs (the checkpoints) are kept
as the settings say:
- whole, on their device (the default);
- cpu_checkpointing: in host RAM, brought back to the device before the recompute;
- partition_activations: each tensor-parallel rank keeps 1/tp of each (its slice, in host
  RAM with cpu_checkpointing), all-gathered over the tensor-parallel group before the
  recompute; ranks of one group hold the same input (Megatron's replicated activations);
- contiguous_memory_optimization (with partition_activations): the slices of input i of
  every checkpoint in one buffer of number_checkpoints slots, allocated once;
- synchronize_checkpoint_boundary: the device synchronised before and after each forward
  and backward; profile: each forward's and backward's time printed on rank 0 as
  DeepSpeed's timers print them ("time (ms) | fwd: ...", "time (ms) | backward: ...").
The RNG states (torch's CPU generator, the device's, and the model-parallel tracker's)
are those of the forward during the recompute, so dropout draws the same masks, and are
put back after it. Unlike DeepSpeed, a checkpointed input is never emptied in place: a
caller that reads it after the call still finds its values.

configure() takes DeepSpeed's arguments (an argument given wins over deepspeed_config);
initialize() configures from its config unless the script did."""
import contextlib
import time
import weakref

import torch

from .. import _zeroshard
from .._common import config as _config, launch as _launch

_KEYS = {  # activation_checkpointing key: (its default, its type)
    "partition_activations": (False, bool),
    "contiguous_memory_optimization": (False, bool),
    "cpu_checkpointing": (False, bool),
    "number_checkpoints": (None, int),
    "synchronize_checkpoint_boundary": (False, bool),
    "profile": (False, bool),
}
# zeroshard's own keys of the section, read elsewhere (config/ConfigSchema.cpp): enabled
# tells the planner that the model's layers recompute their activations, mode and its two
# companions make the engine recompute them (_activations/policy.py), offload keeps what
# the engine's blocks save in host RAM or on NVMe (_activations/offload.py).
_OWN = ("enabled", "mode", "selective_ac_option", "memory_budget", "offload")
MODEL_PARALLEL_RNG = "model-parallel-rng"  # the tracker's name for tensor-parallel dropout


class _Settings:
    def __init__(self):
        self.configured = False
        self.mpu = None
        self.defaults()

    def defaults(self):
        for key, (default, _) in _KEYS.items():
            setattr(self, key, default)
        self.tp_rank, self.tp_size, self.tp_group = 0, 1, None
        self.buffers = {}  # contiguous_memory_optimization: input position -> _Buffer


_settings = _Settings()


def _forget_group():
    _settings.mpu, _settings.tp_group = None, None


_launch.forget_at_exit(_forget_group)
_held = [0]  # bytes of checkpointed inputs held now, on every device and in host RAM


def held_bytes():
    """Bytes this rank holds for checkpoint() calls whose backward has not run: their kept
    inputs (or slices), and contiguous_memory_optimization's buffers. zeroshard's own
    measure (DeepSpeed has none), what the memory model's M_a is checked against."""
    return _held[0]


def _count(tensor, owner):
    """Counts `tensor`'s bytes while `owner` lives."""
    size = tensor.numel() * tensor.element_size()
    _held[0] += size
    weakref.finalize(owner, _uncount, size)


def _uncount(size):
    _held[0] -= size


def _error(message):
    return _zeroshard.Error(f"zeroshard.checkpointing: {message}")


def _rank():
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


# The device's generator: CUDA's where torch has it, else the CPU's (as DeepSpeed's CPU
# accelerator makes it); one test for every use, so a state taken from one generator is
# never given to the other.
def _on_cuda():
    return torch.cuda.is_available()


def _device_rng_state():
    return torch.cuda.get_rng_state() if _on_cuda() else torch.get_rng_state()


def _set_device_rng_state(state):
    if _on_cuda():
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


def _device_manual_seed(seed):
    if _on_cuda():
        torch.cuda.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def _synchronize():
    if _on_cuda():
        torch.cuda.synchronize()


class CudaRNGStatesTracker:
    """Named RNG states of the device's generator (DeepSpeed's and Megatron's tracker):
    fork(name) runs a block on that state and keeps where it left it, the default state
    untouched. The model-parallel state differs across a tensor-parallel group, so its
    ranks draw different dropout masks on their own slices."""

    def __init__(self):
        self.states_, self.seeds_ = {}, set()

    def reset(self):
        self.states_, self.seeds_ = {}, set()

    def get_states(self):
        return dict(self.states_)

    def set_states(self, states):
        self.states_ = states

    def add(self, name, seed):
        if seed in self.seeds_:
            raise _error(f"get_cuda_rng_tracker().add({name!r}, {seed}): seed {seed} is "
                         "already tracked; allowed: a seed no other state uses")
        if name in self.states_:
            raise _error(f"get_cuda_rng_tracker().add({name!r}, {seed}): a state named "
                         f"{name!r} is already tracked; allowed: a new name")
        self.seeds_.add(seed)
        before = _device_rng_state()
        _device_manual_seed(seed)
        self.states_[name] = _device_rng_state()
        _set_device_rng_state(before)

    @contextlib.contextmanager
    def fork(self, name=MODEL_PARALLEL_RNG):
        if name not in self.states_:
            raise _error(f"get_cuda_rng_tracker().fork({name!r}): no state of that name; "
                         f"allowed: {sorted(self.states_) or 'a name add() tracked first'}")
        before = _device_rng_state()
        _set_device_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _device_rng_state()
            _set_device_rng_state(before)


_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker():
    return _TRACKER


def _tp_rank(mpu):
    if mpu is None:
        return 0
    if hasattr(mpu, "get_tensor_model_parallel_rank"):
        return mpu.get_tensor_model_parallel_rank()
    return mpu.get_model_parallel_rank()


def model_parallel_cuda_manual_seed(seed):
    """DeepSpeed's seeding: the default generator gets `seed` (the same on every rank of a
    tensor-parallel group), the tracker's model-parallel state seed + 2718 + the rank's
    tensor-parallel rank."""
    _TRACKER.reset()
    _device_manual_seed(seed)
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + 2718 + _tp_rank(_settings.mpu))


def model_parallel_reconfigure_tp_seed(seed):
    with _TRACKER.fork():
        _device_manual_seed(seed + 2718 + _tp_rank(_settings.mpu))


def _section(deepspeed_config):
    """The activation_checkpointing section of a config (a path to JSON or YAML, or a
    dict), each key checked."""
    config, origin = _config.as_mapping(deepspeed_config, check=False)
    section = (config or {}).get("activation_checkpointing") or {}
    if not isinstance(section, dict):
        raise _error(f"{origin}: activation_checkpointing is {section!r}; allowed: a mapping "
                     f"of {', '.join(_KEYS)}")
    for key, value in section.items():
        if key in _OWN:
            continue
        if key not in _KEYS:
            raise _error(f"{origin}: activation_checkpointing.{key} is no key of DeepSpeed's; "
                         f"allowed: {', '.join(_KEYS)} (and zeroshard's {', '.join(_OWN)})")
        _check(f"{origin}: activation_checkpointing.{key}", key, value)
    return {k: v for k, v in section.items() if k not in _OWN}


def _check(where, key, value):
    default, kind = _KEYS[key]
    if value is None and default is None:
        return
    if kind is bool and not isinstance(value, bool):
        raise _error(f"{where} is {value!r}; allowed: true or false")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise _error(f"{where} is {value!r}; allowed: a count of checkpoints >= 1")


def configure(mpu_, deepspeed_config=None, partition_activations=None,
              contiguous_checkpointing=None, num_checkpoints=None, checkpoint_in_cpu=None,
              synchronize=None, profile=None):
    """DeepSpeed's configure: the defaults, then deepspeed_config's activation_checkpointing
    section, then each argument given. mpu_ (None keeps the last one given) names the
    tensor-parallel group partition_activations splits over and the rank
    model_parallel_cuda_manual_seed offsets by."""
    _apply(mpu_, deepspeed_config, partition_activations, contiguous_checkpointing,
           num_checkpoints, checkpoint_in_cpu, synchronize, profile)
    _settings.configured = True


def _apply(mpu_, deepspeed_config=None, partition_activations=None,
           contiguous_checkpointing=None, num_checkpoints=None, checkpoint_in_cpu=None,
           synchronize=None, profile=None):
    s = _settings
    s.defaults()
    if mpu_ is not None:
        s.mpu = mpu_
    if deepspeed_config is not None:
        for key, value in _section(deepspeed_config).items():
            setattr(s, key, value)
    for arg, key, value in (
            ("partition_activations", "partition_activations", partition_activations),
            ("contiguous_checkpointing", "contiguous_memory_optimization",
             contiguous_checkpointing),
            ("num_checkpoints", "number_checkpoints", num_checkpoints),
            ("checkpoint_in_cpu", "cpu_checkpointing", checkpoint_in_cpu),
            ("synchronize", "synchronize_checkpoint_boundary", synchronize),
            ("profile", "profile", profile)):
        if value is not None:
            _check(f"configure({arg}=...)", key, value)
            setattr(s, key, value)
    if s.contiguous_memory_optimization and not s.partition_activations:
        raise _error("contiguous_memory_optimization lays out partitioned activations; "
                     "allowed: it with partition_activations true, or false")
    if s.contiguous_memory_optimization and s.number_checkpoints is None:
        raise _error("contiguous_memory_optimization sizes its buffers by number_checkpoints, "
                     "which is not set; allowed: the count of checkpoint() calls a forward makes")
    if s.mpu is not None:
        tensor = hasattr(s.mpu, "get_tensor_model_parallel_rank")
        prefix = "get_tensor_model_parallel" if tensor else "get_model_parallel"
        s.tp_rank = getattr(s.mpu, prefix + "_rank")()
        s.tp_size = getattr(s.mpu, prefix + "_world_size")()
        s.tp_group = getattr(s.mpu, prefix + "_group")()
    if _rank() == 0 and s.partition_activations and s.tp_size == 1:
        print("zeroshard.checkpointing: partition_activations with no tensor-parallel group "
              "(no mpu given, or one of size 1): each rank keeps its checkpoints whole",
              flush=True)
    if _rank() == 0:
        print(f"zeroshard.checkpointing: partition_activations {s.partition_activations} "
              f"(over {s.tp_size} tensor-parallel ranks), cpu_checkpointing "
              f"{s.cpu_checkpointing}, contiguous_memory_optimization "
              f"{s.contiguous_memory_optimization} ({s.number_checkpoints} checkpoints), "
              f"synchronize_checkpoint_boundary {s.synchronize_checkpoint_boundary}, "
              f"profile {s.profile}", flush=True)


def configure_from_config(config, mpu):
    """initialize()'s part: a config that sets activation_checkpointing keys gives
    checkpoint() those settings (and the mpu given to initialize), unless the script called
    configure() itself (DeepSpeed reads them only there). is_configured() stays as the script
    left it: Megatron reads it to choose between its own RNG tracker and this one."""
    if _settings.configured or not _section(config):
        return
    _apply(mpu, deepspeed_config=config)


def is_configured():
    return _settings.configured


def partition_activations_in_checkpoint(partition_activation):
    _settings.partition_activations = bool(partition_activation)


def set_num_layers(nlayers):
    _settings.number_checkpoints = nlayers


def reset():
    """Forgets the contiguous buffers (DeepSpeed's: call it after forwards that no backward
    followed, as in evaluation)."""
    _settings.buffers = {}


def _kept(item):
    """DeepSpeed's test of a checkpointed input: a floating tensor of at least tp elements
    not marked no_checkpointing."""
    return (torch.is_tensor(item) and item.is_floating_point()
            and item.numel() >= _settings.tp_size and not getattr(item, "no_checkpointing", False))


class _Buffer:
    """contiguous_memory_optimization: one input position's slices of number_checkpoints
    checkpoints, in one allocation."""

    def __init__(self, slots, part, device):
        self.tensor = torch.empty((slots, part.numel()), dtype=part.dtype, device=device)
        self.used = 0
        _count(self.tensor, self)

    def fits(self, part, device):
        return (self.tensor.dtype == part.dtype and self.tensor.shape[1] == part.numel()
                and self.tensor.device == device)


def _slot(position, part, device):
    """contiguous_memory_optimization: the next slot of input `position`'s buffer."""
    s = _settings
    buffer = s.buffers.get(position)
    if buffer is None or not buffer.fits(part, device):
        buffer = s.buffers[position] = _Buffer(s.number_checkpoints, part, device)
    if buffer.used >= buffer.tensor.shape[0]:
        raise _error(f"more checkpoint() calls before a backward than number_checkpoints "
                     f"({s.number_checkpoints}); allowed: number_checkpoints at least the "
                     "calls one forward makes")
    buffer.used += 1
    return buffer.tensor[buffer.used - 1].copy_(part), buffer


class _Saved:
    """One checkpointed input as kept between forward and backward."""

    def __init__(self, position, arg):
        s = _settings
        self.shape, self.device, self.needs_grad = arg.shape, arg.device, arg.requires_grad
        host = torch.device("cpu")
        if s.partition_activations:
            if arg.numel() % s.tp_size:
                raise _error(f"partition_activations: a checkpointed input of shape "
                             f"{tuple(arg.shape)} ({arg.numel()} elements) does not split into "
                             f"{s.tp_size} equal slices; allowed: inputs whose element count "
                             "the tensor-parallel size divides")
            size = arg.numel() // s.tp_size
            part = arg.detach().reshape(-1).narrow(0, s.tp_rank * size, size)
            where = host if s.cpu_checkpointing else arg.device
            if s.contiguous_memory_optimization:
                # The buffer is counted while any checkpoint holds a slot of it.
                self.data, self.buffer = _slot(position, part, where)
            else:
                self.data = part.to(where, copy=True)
                _count(self.data, self)
            self.partitioned = True
        else:
            self.data = arg.detach().to(host) if s.cpu_checkpointing else arg.detach()
            self.partitioned = False
            _count(self.data, self)

    def restore(self):
        s = _settings
        data, self.data, self.buffer = self.data.to(self.device), None, None
        if self.partitioned and s.tp_size > 1:
            parts = [torch.empty_like(data) for _ in range(s.tp_size)]
            torch.distributed.all_gather(parts, data, group=s.tp_group)
            data = torch.cat(parts)
        out = data.reshape(self.shape).detach()
        return out.requires_grad_(self.needs_grad)


def _timed(what):
    """profile: the block's time on rank 0, as DeepSpeed's timers log it."""
    @contextlib.contextmanager
    def block():
        s = _settings
        if s.synchronize_checkpoint_boundary:
            _synchronize()
        start = time.perf_counter()
        yield
        if s.synchronize_checkpoint_boundary or s.profile:
            _synchronize()
        if s.profile and _rank() == 0:
            print(f"time (ms) | {what}: {(time.perf_counter() - start) * 1000:.2f}", flush=True)
    return block()


class _CheckpointFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, run_function, returned, *args):
        with _timed("fwd"):
            ctx.run_function = run_function
            ctx.rng = (torch.get_rng_state(), _device_rng_state(), _TRACKER.get_states())
            # Kept before the run: a function that changes an input in place must not
            # change what its recompute starts from.
            ctx.inputs = [_Saved(i, a) if _kept(a) else a for i, a in enumerate(args)]
            with torch.no_grad():
                outputs = run_function(*args)
        single = torch.is_tensor(outputs)
        listed = [outputs] if single else list(outputs)
        ctx.mark_non_differentiable(*[o for o in listed
                                      if torch.is_tensor(o) and not o.is_floating_point()])
        returned.extend(listed)
        tensors = tuple(o for o in listed if torch.is_tensor(o))
        return outputs if single else tensors

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise _error("checkpoint() recomputes inside backward(); torch.autograd.grad() "
                         "does not allow that; allowed: loss.backward()")
        _settings.buffers = {}  # the slots' contents are held by the checkpoints that use them
        with _timed("backward"):
            inputs = [a.restore() if isinstance(a, _Saved) else _detached(a)
                      for a in ctx.inputs]
            ctx.inputs = None
            now = (torch.get_rng_state(), _device_rng_state(), _TRACKER.get_states())
            torch.set_rng_state(ctx.rng[0])
            _set_device_rng_state(ctx.rng[1])
            _TRACKER.set_states(ctx.rng[2])
            try:
                with torch.enable_grad():
                    outputs = ctx.run_function(*inputs)
            finally:
                torch.set_rng_state(now[0])
                _set_device_rng_state(now[1])
                _TRACKER.set_states(now[2])
            outputs = [outputs] if torch.is_tensor(outputs) else list(outputs)
            pairs = [(o, g) for o, g in zip([o for o in outputs if torch.is_tensor(o)], grads)
                     if o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None) + tuple(i.grad if torch.is_tensor(i) else None for i in inputs)


def _detached(item):
    """A tensor input the recompute starts from: cut from the graph that made it (its
    gradient is returned, never accumulated through that graph twice)."""
    if not torch.is_tensor(item):
        return item
    return item.detach().requires_grad_(item.requires_grad)


def checkpoint(function, *args, **kwargs):
    """function(*args, **kwargs) with its activations recomputed in backward; tensors given
    by keyword take part in autograd as positional ones do. Returns what function returns
    (its non-tensor outputs too)."""
    if kwargs:
        inner, names, count = function, tuple(kwargs), len(args)

        def function(*all_args):
            return inner(*all_args[:count], **dict(zip(names, all_args[count:])))

        args = args + tuple(kwargs.values())
    returned = []
    _CheckpointFunction.apply(function, returned, *args)
    return returned[0] if len(returned) == 1 else tuple(returned)
