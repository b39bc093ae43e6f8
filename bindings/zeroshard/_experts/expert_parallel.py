"""DeepSpeed's mixture-of-experts layer (deepspeed.moe.layer.MoE and its parts), its
experts held by every rank (ep_size 1) or split across ep_size ranks.

MoE(hidden_size, expert, num_experts, ...) routes each token to k of num_experts copies of
`expert` (moe_gating.py), runs each expert on the tokens it got (up to its capacity), and
sums their outputs weighted by the gate; forward returns (output, l_aux, exp_counts) as
DeepSpeed's does. The module tree and parameter names are DeepSpeed's
(deepspeed_moe.gate.wg, deepspeed_moe.experts.deepspeed_experts.<i>, mlp and coefficient
with use_residual), so state dicts and checkpoints line up; the experts' parameters carry
DeepSpeed's marks (allreduce False, group_name "ep_size_1").

At ep_size 1 every expert parameter is an ordinary data-parallel parameter: DeepSpeed
averages its gradient over the expert-data-parallel group, which is then every rank, so
the engine's reduction of dense parameters is DeepSpeed's for them too, and every ZeRO
stage (3 included, which DeepSpeed's MoE refuses) shards them like the rest.

At ep_size N > 1 each rank of an expert-parallel group (N consecutive ranks,
expert_groups.py) holds num_experts / N of the experts: the gate's dispatched slots go to
the rank holding their expert and the outputs come back (an all-to-all each way, whose
backward is the same all-to-all), so every expert sees its tokens from the whole group.
The engine (expert_parameters below) reduces and shards those experts' parameters over
the ranks holding the same ones, divided by every data-parallel rank as DeepSpeed divides
them, at ZeRO 0-3 (3 too, which DeepSpeed refuses for its MoE)."""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import _zeroshard
from .._common import expert_groups, process_groups
from .moe_gating import multiplicative_jitter, top1gating, top2gating, topkgating


def _error(message):
    return _zeroshard.Error(f"deepspeed.moe.layer.MoE: {message}")


class Experts(torch.nn.Module):
    """num_local_experts copies of `expert`, each fed its slice of the dispatched tokens."""

    def __init__(self, expert, num_local_experts=1, expert_group_name=None):
        super().__init__()
        self.deepspeed_experts = torch.nn.ModuleList(
            [copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for one in self.deepspeed_experts:
            for param in one.parameters():
                param.allreduce = False  # DeepSpeed's mark of an expert parameter
                param.group_name = expert_group_name

    def forward(self, inputs):
        outputs = []
        for chunk, expert in zip(inputs.chunk(self.num_local_experts, dim=1),
                                 self.deepspeed_experts):
            out = expert(chunk)
            outputs.append(out[0] if isinstance(out, tuple) else out)  # a bias term is dropped
        return torch.cat(outputs, dim=1)


class TopKGate(torch.nn.Module):
    """The router: a bias-free Linear from the model dimension to one logit per expert,
    computed in fp32, then top-1, top-2 or top-k gating (capacity_factor in training,
    eval_capacity_factor in evaluation; noise only in training)."""

    def __init__(self, model_dim, num_experts, k=1, capacity_factor=1.0,
                 eval_capacity_factor=1.0, min_capacity=8, noisy_gate_policy=None,
                 drop_tokens=True, use_rts=True, ep_group=None, top2_2nd_expert_sampling=True):
        super().__init__()
        self.wg = torch.nn.Linear(model_dim, num_experts, bias=False)
        self.ep_group = ep_group
        self.k = k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        self.wall_clock_breakdown = False
        self.gate_time = 0.0

    def _set_ep_group(self, ep_group):
        self.ep_group = ep_group

    def forward(self, input, used_token=None, sparse_routes=False, use_tutel=False):
        x = input.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            x = multiplicative_jitter(x, device=input.device)
        logits = F.linear(x, weight=self.wg.weight.float(), bias=None)
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return top1gating(logits, factor, self.min_capacity, used_token,
                              self.noisy_gate_policy if self.training else None,
                              self.drop_tokens, self.use_rts, self.ep_group, sparse_routes,
                              use_tutel)
        if self.k == 2:
            return top2gating(logits, factor, self.min_capacity, self.drop_tokens, self.ep_group,
                              self.top2_2nd_expert_sampling, sparse_routes)
        return topkgating(logits, self.k, factor, self.min_capacity, self.drop_tokens,
                          self.ep_group, sparse_routes=sparse_routes)


class _AllToAll(torch.autograd.Function):
    """Chunk i of dim 0 to rank i of the group, and back the same way for the gradient."""

    @staticmethod
    def forward(ctx, group, inputs):
        ctx.group = group
        inputs = inputs.contiguous()
        output = torch.empty_like(inputs)
        with process_groups.named("the MoE layer's all-to-all", group):
            dist.all_to_all_single(output, inputs, group=group)
        return output

    @staticmethod
    def backward(ctx, grad):
        return None, _AllToAll.apply(ctx.group, grad)


class MOELayer(torch.nn.Module):
    """Gate, dispatch to the experts' capacity slots, experts, weighted combine."""

    def __init__(self, gate, experts, ep_group_name, ep_size, num_local_experts,
                 use_tutel=False):
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.ep_group = None
        self.ep_size = ep_size
        self.ep_group_name = ep_group_name
        self.num_local_experts = num_local_experts
        self.use_tutel = False
        self.wall_clock_breakdown = False
        self.time_falltoall = self.time_salltoall = self.time_moe = 0.0

    def _set_ep_group(self, ep_group):
        self.ep_group = ep_group
        self.gate._set_ep_group(ep_group)

    def forward(self, *input, **kwargs):
        d_model = input[0].shape[-1]
        tokens = input[0].reshape(-1, d_model)
        used = input[1] if len(input) > 1 else None
        self.l_aux, capacity, experts, indices, locations, weights, self.exp_counts = \
            self.gate(tokens, used, sparse_routes=True)
        count, capacity = tokens.size(0), int(capacity)
        # Each route's slot in the experts' [E x capacity] rows; a dropped route points at
        # one spare row past them, which reads zeros and is never an expert's input.
        spare = experts * capacity
        slots = torch.where(indices >= 0, indices.long() * capacity + locations.long(),
                            torch.full_like(indices, spare, dtype=torch.long))
        source = torch.full((spare + 1,), count, dtype=torch.long, device=slots.device)
        source.scatter_(0, slots.reshape(-1),
                        torch.arange(count, device=slots.device).expand_as(slots).reshape(-1))
        padded = torch.cat([tokens, tokens.new_zeros(1, d_model)])
        dispatched = padded.index_select(0, source[:-1]).view(experts, capacity, d_model)
        if self.ep_size > 1:  # each expert's slots to the rank holding it: [source rank, ...]
            dispatched = _AllToAll.apply(self._group(), dispatched)
        dispatched = dispatched.reshape(self.ep_size, self.num_local_experts, -1, d_model)
        out = self.experts(dispatched).reshape(self.ep_size * self.num_local_experts, -1,
                                               d_model)
        if self.ep_size > 1:  # and each output back to the rank its token came from
            out = _AllToAll.apply(self._group(), out)
        rows = torch.cat([out.view(experts * capacity, d_model), out.new_zeros(1, d_model)])
        routed = rows.index_select(0, slots.reshape(-1)).view(slots.size(0), count, d_model)
        combined = (routed * weights.unsqueeze(-1)).sum(0).to(out.dtype)
        return combined.reshape(input[0].shape)

    def _group(self):
        if self.ep_group is None:
            raise _error(
                f"ep_size={self.ep_size}: the layer ran before its expert-parallel group was "
                "made; allowed: a model given to zeroshard.initialize first (its engine makes "
                "the groups), or set_deepspeed_parallelism() called on every rank")
        return self.ep_group


class MoE(torch.nn.Module):
    """deepspeed.moe.layer.MoE, its arguments and defaults."""

    def __init__(self, hidden_size, expert, num_experts=1, ep_size=1, k=1, capacity_factor=1.0,
                 eval_capacity_factor=1.0, min_capacity=4, use_residual=False,
                 noisy_gate_policy=None, drop_tokens=True, use_rts=True, use_tutel=False,
                 enable_expert_tensor_parallelism=False, top2_2nd_expert_sampling=True):
        super().__init__()
        if num_experts < 1:
            raise _error(f"num_experts={num_experts}; allowed: a count of experts >= 1")
        if not isinstance(ep_size, int) or ep_size < 1 or num_experts % ep_size:
            raise _error(f"ep_size={ep_size!r} does not divide num_experts={num_experts}; "
                         "allowed: a divisor of num_experts (each rank of an expert-parallel "
                         "group holds num_experts / ep_size of them)")
        if noisy_gate_policy not in (None, "None", "Jitter", "RSample"):
            raise _error(f"noisy_gate_policy={noisy_gate_policy!r}; allowed: None, 'None', "
                         "'Jitter', 'RSample'")
        if not isinstance(k, int) or not 1 <= k <= num_experts:
            raise _error(f"k={k!r}; allowed: an int from 1 to num_experts ({num_experts})")
        if use_tutel:
            raise _error("use_tutel=True: Tutel's kernels are not used here; allowed: False")
        if enable_expert_tensor_parallelism:
            raise _error("enable_expert_tensor_parallelism=True: experts are not split over "
                         "tensor-parallel ranks here; allowed: False")
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = False
        self.ep_size = ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        gate = TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor,
                        min_capacity, noisy_gate_policy, drop_tokens, use_rts, None,
                        top2_2nd_expert_sampling)
        self.deepspeed_moe = MOELayer(gate, experts, self.expert_group_name, ep_size,
                                      self.num_local_experts)
        if use_residual:
            self.mlp = expert
            self.coefficient = torch.nn.Linear(hidden_size, 2)  # the two outputs' weights

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
        """Makes this layer's expert-parallel groups (a collective: every rank calls it, as
        the engine does at initialize); at ep_size 1 there are none to make."""
        if self.ep_size > 1:
            name = expert_groups.make(self.ep_size, use_data_before_expert_parallel_)
            self.deepspeed_moe._set_ep_group(expert_groups.expert_parallel_group(name))

    def forward(self, hidden_states, used_token=None):
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            dense = dense[0] if isinstance(dense, tuple) else dense
            coef = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + dense * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts


def expert_parameters(model, parameters, autoep_size=0):
    """(ep_size, the names of the experts' parameters split across it) for the engine, the
    layers' groups made: (1, empty) where every rank holds every expert. `parameters`: the
    engine's (name, parameter) pairs; `autoep_size`: the size a Hugging Face model's experts
    were split at (hf_expert_parallel.py; 0: none). Layers of different ep_size are refused
    by name."""
    sizes = sorted({m.ep_size for m in model.modules() if isinstance(m, MoE)}
                   | ({autoep_size} if autoep_size else set()))
    if len(sizes) > 1:
        raise _error(f"layers of ep_size {sizes}: one model's experts split over different "
                     "groups are not composed here; allowed: one ep_size for every MoE layer")
    if not sizes or sizes[0] == 1:
        return 1, set()
    for module in model.modules():
        if isinstance(module, MoE):
            module.set_deepspeed_parallelism()
    return sizes[0], {name for name, p in parameters if is_moe_param(p)}


def has_moe_layers(model):
    """(whether `model` holds an MoE layer, the first one's num_experts)."""
    for module in model.modules():
        if isinstance(module, MoE):
            return True, module.num_experts
    return False, 0


def is_moe_param(param):
    """DeepSpeed's mark of an expert parameter: `allreduce` set to False."""
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_shared_and_expert_params(params):
    shared, expert = [], []
    for p in params:
        (expert if is_moe_param(p) else shared).append(p)
    return shared, expert


def split_params_grads_into_shared_and_expert_params(group):
    """(the shared parameters' gradients, the experts'), each in its parameter's dtype."""
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert


def split_params_into_different_moe_groups_for_optimizer(param_groups,
                                                         max_group_size=178956971):
    """DeepSpeed's split: each group's expert parameters move to groups of their own (the
    same hyperparameters, 'name' the experts' group name, 'moe' True, at most
    max_group_size elements each), appended after the groups given; every group needs a
    'name'. Returns the list (a dict or a tuple given becomes a list)."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")
    for i, group in enumerate(param_groups):
        group["params"] = list(group["params"])
        if "name" not in group and any(is_moe_param(p) for p in group["params"]):
            raise _zeroshard.Error(
                f"split_params_into_different_moe_groups_for_optimizer: param_groups[{i}] holds "
                "expert parameters and has no 'name'; allowed: groups with a 'name' (DeepSpeed "
                "names the expert groups after them), e.g. {'params': ..., 'name': 'parameters'}")
    names = sorted({p.group_name for g in param_groups for p in g["params"] if is_moe_param(p)})
    made = []
    for group in param_groups:
        for name in names:
            params = [p for p in group["params"] if is_moe_param(p) and p.group_name == name]
            made.extend({**group, "name": name, "moe": True, "params": part}
                        for part in _limited(params, max_group_size))
        group["params"] = [p for p in group["params"] if not is_moe_param(p)]
    return param_groups + made


def _limited(params, max_group_size):
    """params in consecutive runs of at most max_group_size elements (one run: None)."""
    if max_group_size is None:
        return [params]
    runs, run, size = [], [], 0
    for p in params:
        numel = getattr(p, "ds_numel", p.numel())
        if run and size + numel > max_group_size:
            runs.append(run)
            run, size = [], 0
        run.append(p)
        size += numel
    return runs + ([run] if run else [])


def is_moe_param_group(param_group):
    return param_group.get("moe", False)


def configure_moe_param_groups(model_parameters):
    """model_parameters (parameters, or groups) as groups with the experts apart, unless
    some group is already marked 'moe'."""
    if not isinstance(model_parameters, list):
        raise TypeError("model_parameters must be a list")
    first = model_parameters[0]
    if isinstance(first, torch.nn.Parameter):
        return split_params_into_different_moe_groups_for_optimizer(
            {"params": model_parameters, "name": "dense-params"})
    if any("moe" in g for g in model_parameters):
        return model_parameters
    return split_params_into_different_moe_groups_for_optimizer(model_parameters)
