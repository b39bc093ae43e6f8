"""DeepSpeed's pipeline model, with its names (zeroshard.pipe): a model given as a list of
layers (LayerSpec, TiedLayerSpec, modules or callables) that each rank builds only its
stage's share of. Stages are the outermost dimension (engine/ParallelDims.h): with W ranks
and P stages, ranks [s * W/P, (s + 1) * W/P) build stage s, as DeepSpeed's
PipeDataParallelTopology numbers them.

What DeepSpeed does that changes numbers, done alike:
- partition_method 'parameters' counts each layer's trainable parameters by building every
  LayerSpec on every rank, in order (so the random stream the stage's own layers are then
  built from is the one DeepSpeed's are built from), and splits them by the linear
  partition that minimises the spread between the largest and the smallest stage (ties to
  the later cut); 'uniform' splits the layer count evenly (the first stages one more);
  'type:REGEX' balances the layers whose class name matches;
- seed_layers seeds each layer's build with base_seed + its index;
- a TiedLayerSpec's module is built once per stage that holds its key and reused by each of
  its occurrences (through forward_fn where given); the copies start from the lowest stage's
  values and train as one parameter (bindings/zeroshard/_engine/pipe_engine.py)."""
import functools
import random
import re
import warnings

import torch
import torch.nn as nn
import torch.utils.checkpoint

from .. import _zeroshard
from .._activations import checkpointing as _checkpointing
from .pipe_topology import pipe_and_data


def _error(message):
    return _zeroshard.Error(f"zeroshard.pipe: {message}")


class LayerSpec:
    """A layer built where it is used: typename(*module_args, **module_kwargs)."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise _error(f"LayerSpec: typename {typename!r}; allowed: a torch.nn.Module class")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self):
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self):
        return f"LayerSpec({self.typename.__name__})"


class TiedLayerSpec(LayerSpec):
    """A layer whose `tied_weight_attr` parameters are shared by every layer of the same
    `key` (an embedding reused as the output head through forward_fn(module, x))."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",),
                 **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        attrs = [tied_weight_attr] if isinstance(tied_weight_attr, str) else tied_weight_attr
        self.tied_weight_attr = list(attrs)


def partition_uniform(items, parts):
    """Boundaries [0, ..., items] of `parts` stages: equal shares, the first stages one more."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    share, extra = divmod(items, parts)
    return [p * share + min(p, extra) for p in range(parts + 1)]


def partition_balanced(weights, parts):
    """Boundaries of the linear partition of `weights` into `parts` contiguous, non-empty
    stages whose largest and smallest sums are closest, the later cut where two are alike."""
    n = len(weights)
    if n <= parts:
        return partition_uniform(n, parts)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[i][j]: (spread, largest, smallest, last cut) of the first i layers in j stages.
    best = [[(inf, inf, inf, 0)] * (parts + 1) for _ in range(n + 1)]
    best[0][0] = (0, 0, inf, 0)
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            chosen = best[i][j]
            for k in range(i):
                part = prefix[i] - prefix[k]
                largest = max(best[k][j - 1][1], part)
                smallest = min(best[k][j - 1][2], part)
                spread = largest - smallest
                if chosen[0] >= spread:
                    chosen = (spread, largest, smallest, k)
            best[i][j] = chosen
    cuts = [n]
    for j in range(parts, 0, -1):
        cuts.append(best[cuts[-1]][j][3])
    return cuts[::-1]


def _seed(seed):
    """DeepSpeed's set_random_seed: numpy takes 32-bit seeds, torch 64-bit ones (seed_layers'
    seeds grow with every forward)."""
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % (2 ** 32))
    except ImportError:
        pass
    torch.manual_seed(seed % (2 ** 63))


def is_non_reentrant(func):
    """zeroshard's non_reentrant_checkpoint or DeepSpeed's own (a script may pass it)."""
    return func is non_reentrant_checkpoint or getattr(func, "__name__", "") == \
        "non_reentrant_checkpoint"


class PipelineModule(nn.Module):
    """deepspeed.pipe.PipelineModule: `layers` split over `num_stages`; this rank builds and
    runs its stage's share. loss_fn(outputs, labels) runs on the last stage."""

    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers=False,
                 seed_fn=None, base_seed=1234, partition_method="parameters",
                 activation_checkpoint_interval=0, activation_checkpoint_func=None,
                 checkpointable_layers=None, dynamic_shape=False):
        super().__init__()
        if dynamic_shape:
            raise _error("dynamic_shape=True: not supported yet; allowed: False (every "
                         "micro-batch of a step has the shapes of the first)")
        if checkpointable_layers is not None and not isinstance(checkpointable_layers, list):
            raise _error(f"checkpointable_layers={checkpointable_layers!r}; allowed: a list of "
                         "layer class names, or None")
        env = _zeroshard.launch_env()
        world, rank = env["world_size"], env["rank"]
        if topology is not None:
            topology_stages, _ = pipe_and_data(topology, world)
            if num_stages not in (None, topology_stages):
                raise _error(f"num_stages={num_stages} but the topology has {topology_stages} "
                             "stages on its 'pipe' axis; allowed: the same, or leave it out")
            num_stages = topology_stages
        if num_stages is None or int(num_stages) < 2:
            raise _error(f"num_stages={num_stages!r}; allowed: 2 or more")
        if world % num_stages:
            raise _error(f"num_stages={num_stages} does not divide the {world} ranks")
        self.num_stages = int(num_stages)
        self.stage_id = rank // (world // self.num_stages)
        self.loss_fn = loss_fn
        self.seed_layers, self.seed_fn, self.base_seed = seed_layers, seed_fn, base_seed
        self.micro_offset = 0  # forwards run so far: seed_layers reseeds each from it
        self.activation_checkpoint_interval = int(activation_checkpoint_interval)
        self.activation_checkpoint_func = activation_checkpoint_func or reentrant_checkpoint
        self.checkpointable_layers = checkpointable_layers
        self._warned_no_gradient = set()
        self._layer_specs = list(layers)
        self.parts = self._partition(partition_method)
        self._local_start = self.parts[self.stage_id]
        self._local_stop = self.parts[self.stage_id + 1]
        self.forward_funcs = []
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs = {}
        self._build()
        if torch.cuda.is_available():  # as DeepSpeed's: on this rank's GPU once built
            self.to(torch.device("cuda", env["local_rank"]))

    def _partition(self, method):
        specs, stages = self._layer_specs, self.num_stages
        method = method.lower()
        if method == "uniform":
            return partition_uniform(len(specs), stages)
        if method == "parameters":
            return partition_balanced([self._trainable(s) for s in specs], stages)
        if method.startswith("type:"):
            pattern = re.compile(method[len("type:"):], re.IGNORECASE)
            weights = [1 if pattern.search(self._class_name(s)) else 0 for s in specs]
            if not any(weights):
                raise _error(f"partition_method '{method}' matches no layer")
            return partition_balanced(weights, stages)
        raise _error(f"partition_method '{method}'; allowed: parameters, uniform, type:REGEX")

    @staticmethod
    def _trainable(spec):
        if isinstance(spec, LayerSpec):
            spec = spec.build()  # every rank builds it, in order, as DeepSpeed counts
        if isinstance(spec, nn.Module):
            return sum(p.numel() for p in spec.parameters() if p.requires_grad)
        return 0

    @staticmethod
    def _class_name(spec):
        if isinstance(spec, LayerSpec):
            return spec.typename.__name__
        return type(spec).__name__

    def _build(self):
        for index in range(self._local_start, self._local_stop):
            spec = self._layer_specs[index]
            if self.seed_layers:
                (self.seed_fn or _seed)(self.base_seed + index)
            if isinstance(spec, TiedLayerSpec):
                if spec.key not in self.tied_modules:
                    self.tied_modules[spec.key] = spec.build()
                    self.tied_weight_attrs[spec.key] = spec.tied_weight_attr
                module = self.tied_modules[spec.key]
                self.forward_funcs.append(
                    module if spec.forward_fn is None else functools.partial(spec.forward_fn,
                                                                             module))
            elif isinstance(spec, LayerSpec):
                module = spec.build()
                self.add_module(str(index), module)
                self.forward_funcs.append(module)
            elif isinstance(spec, nn.Module):
                self.add_module(str(index), spec)
                self.forward_funcs.append(spec)
            elif callable(spec):
                self.forward_funcs.append(spec)
            else:
                raise _error(f"layers[{index}]: a {type(spec).__name__}; allowed: LayerSpec, "
                             "TiedLayerSpec, a torch.nn.Module or a callable")

    def tied_stages(self, key):
        """The stages that hold a layer of `key`, in order."""
        return [s for s in range(self.num_stages)
                if any(isinstance(spec, TiedLayerSpec) and spec.key == key
                       for spec in self._layer_specs[self.parts[s]:self.parts[s + 1]])]

    def tied_keys(self):
        """Every key of the model's TiedLayerSpecs, in order of first appearance."""
        keys = []
        for spec in self._layer_specs:
            if isinstance(spec, TiedLayerSpec) and spec.key not in keys:
                keys.append(spec.key)
        return keys

    def _run_layers(self, start, stop):
        """Layers [start, stop) of this stage as one function, each reseeded first under
        seed_layers (base_seed x (the forward's number + 1) + the layer's index, as DeepSpeed's,
        the same again when a checkpoint recomputes it)."""
        micro_offset = self.micro_offset + 1

        def run(*inputs):
            x = inputs[0] if len(inputs) == 1 else inputs
            for index in range(start, stop):
                if self.seed_layers:
                    # DeepSpeed numbers the layers of a checkpointed chunk from the stage's
                    # first again (its enumerate over the chunk): alike, for its masks.
                    layer = self._local_start + index - start
                    (self.seed_fn or _seed)(self.base_seed * micro_offset + layer)
                x = self.forward_funcs[index](x)
            return x

        return run

    def _is_checkpointable(self, funcs):
        """DeepSpeed's rule: Megatron's GPT pipes checkpoint their transformer layers (and the
        listed classes) only, under a reentrant checkpoint; otherwise the listed classes, or,
        with no list, any chunk holding a module with parameters."""
        names = [type(f).__name__ for f in funcs]
        if (not is_non_reentrant(self.activation_checkpoint_func)
                and type(self).__name__ in ("GPTModelPipe", "GPT2ModelPipe")):
            listed = self.checkpointable_layers or []
            return all("ParallelTransformerLayerPipe" in n or n in listed for n in names)
        if self.checkpointable_layers is not None:
            return all(n in self.checkpointable_layers for n in names)
        return any(len(list(f.parameters())) > 0 for f in funcs if isinstance(f, nn.Module))

    def _first_stage_input(self, x):
        """As DeepSpeed's engine loads the first stage's micro-batch under a reentrant
        checkpoint: a floating-point input needs a gradient, so that the checkpointed layers
        that read it get theirs."""
        if (self.stage_id != 0 or not self.activation_checkpoint_interval
                or is_non_reentrant(self.activation_checkpoint_func)):
            return x

        def needing_grad(t):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.requires_grad:
                return t.detach().requires_grad_(torch.is_grad_enabled())
            return t

        return tuple(needing_grad(t) for t in x) if isinstance(x, tuple) else needing_grad(x)

    def _warn_no_gradient(self, start, stop, inputs):
        """A reentrant checkpoint over inputs none of which needs a gradient gives its layers'
        parameters none (DeepSpeed's numbers, so done alike), said once per chunk."""
        if (not torch.is_grad_enabled() or start in self._warned_no_gradient
                or is_non_reentrant(self.activation_checkpoint_func)
                or any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)):
            return
        self._warned_no_gradient.add(start)
        first, last = self._local_start + start, self._local_start + stop - 1
        warnings.warn(f"zeroshard.pipe: stage {self.stage_id}'s layers {first}..{last} are "
                      "checkpointed by a reentrant checkpoint over inputs that need no "
                      "gradient (integer token ids): their parameters get no gradient from "
                      "this use, as under DeepSpeed. pipeline.use_reentrant: false in the "
                      "config, or checkpointable_layers without them, gives them theirs")

    def forward(self, x):
        self.micro_offset += 1
        interval = self.activation_checkpoint_interval
        if not interval:
            return self._run_layers(0, len(self.forward_funcs))(x)
        x = self._first_stage_input(x)
        for start in range(0, len(self.forward_funcs), interval):
            stop = min(start + interval, len(self.forward_funcs))
            inputs = x if isinstance(x, tuple) else (x,)
            if self._is_checkpointable(self.forward_funcs[start:stop]):
                self._warn_no_gradient(start, stop, inputs)
                x = self.activation_checkpoint_func(self._run_layers(start, stop), *inputs)
            else:
                x = self._run_layers(start, stop)(*inputs)
        return x


def reentrant_checkpoint(function, *args):
    """DeepSpeed's default activation_checkpoint_func, deepspeed.checkpointing.checkpoint:
    outputs kept, inner activations recomputed in backward, the RNG state restored for it,
    its inputs kept as the activation_checkpointing keys say (_activations/checkpointing.py)."""
    return _checkpointing.checkpoint(function, *args)


def non_reentrant_checkpoint(function, *args):
    """DeepSpeed's non_reentrant_checkpoint (pipeline.use_reentrant: false): parameters get
    their gradients whether or not the inputs need one."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
