"""A Hugging Face mixture-of-experts model's experts split over expert-parallel ranks, as
DeepSpeed's AutoEP splits them (config: expert_parallel {enabled: true, autoep_size: N,
preset_model, use_grouped_mm}).

transformers 5 keeps each MoE block's experts as one module of fused 3-D weights
(gate_up_proj [E, 2I, H], down_proj [E, H, I]: Mixtral, Qwen2/3-MoE, OLMoE, ...), called
with the router's choices (hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]).
Here each rank of an expert-parallel group (N consecutive ranks, _common/expert_groups.py) keeps
E / N of those experts (the slices [r E/N, (r+1) E/N) of both weights, marked as DeepSpeed
marks expert parameters: allreduce False, group_name "ep_size_N"), and the module's forward
becomes a dropless exchange: every route (token, expert) is sent to the rank holding its
expert (an all-to-all of variable sizes, the counts exchanged first), each expert runs
the model's own arithmetic on the tokens it got from the whole group (all of a rank's
experts in one grouped GEMM where torch runs it: _local_experts), and the outputs come back
the same way (the backward is the same exchange reversed), weighted by the router and
summed per token as the model sums them. The router, shared experts and everything else
stay dense. The engine reduces and shards the experts' parameters over the ranks holding
the same ones (_experts/expert_parallel.py expert_parameters). A model built inside
zeroshard.init has its experts gathered whole one weight at a time to be cut."""
import types

import torch
import torch.distributed as dist

from .. import _zeroshard
from .._common import expert_groups, process_groups
from .._parallel.param_shards import Sharder, is_sharded

# Hugging Face model_types whose experts modules are the fused layout above (AutoEP's presets).
PRESETS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "qwen3_next", "deepseek_v3")


def _error(message):
    return _zeroshard.Error(f"expert_parallel (AutoEP): {message}")


def apply(model, loaded):
    """Splits `model`'s experts as the config's expert_parallel section asks (a collective:
    every rank calls it); returns the ep size (0 where the section is off)."""
    autoep = loaded.autoep
    if autoep is None:
        return 0
    size, preset, grouped = autoep
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if preset and preset not in PRESETS:
        raise _error(f"preset_model is {preset!r}; allowed: {', '.join(PRESETS)}, or left out "
                     "(the model's own model_type)")
    if preset and model_type and preset != model_type:
        raise _error(f"preset_model is {preset!r} but the model's model_type is "
                     f"{model_type!r}; allowed: {model_type!r}, or left out")
    blocks = [(name, m) for name, m in model.named_modules() if _is_experts(m)]
    if not blocks:
        raise _error(f"enabled, but {type(model).__name__} has no experts module of fused "
                     "3-D weights (gate_up_proj [E, 2I, H], down_proj [E, H, I]: transformers "
                     "5's Mixtral, Qwen2/3-MoE, OLMoE, ...); allowed: such a model, or "
                     "expert_parallel.enabled false")
    if not grouped:  # DeepSpeed's use_grouped_mm false: transformers' loop of matmuls
        if not hasattr(model, "set_experts_implementation"):
            raise _error(f"use_grouped_mm is false but {type(model).__name__} has no "
                         "set_experts_implementation (transformers 5's) to ask its loop by; "
                         "allowed: true")
        model.set_experts_implementation("eager")
    if size == 1:
        return 1
    name = expert_groups.make(size)
    group = expert_groups.expert_parallel_group(name)
    place = expert_groups.expert_parallel_ranks(name).index(dist.get_rank())
    for path, module in blocks:
        _split(path, module, size, place, group, name)
    return size


def _is_experts(module):
    params = dict(module.named_parameters(recurse=False))
    return set(params) >= {"gate_up_proj", "down_proj"} and hasattr(module, "num_experts") \
        and params["gate_up_proj"].dim() == 3


def _split(path, module, size, place, group, name):
    layout = {a: getattr(module, a, d) for a, d in
              (("has_bias", False), ("is_transposed", False), ("has_gate", True),
               ("is_concatenated", True))}
    extra = set(dict(module.named_parameters(recurse=False))) - {"gate_up_proj", "down_proj"}
    if extra or layout != {"has_bias": False, "is_transposed": False, "has_gate": True,
                           "is_concatenated": True}:
        raise _error(f"{path} ({type(module).__name__}) keeps its experts as {layout} with "
                     f"parameters {sorted(extra)} besides gate_up_proj and down_proj; allowed: "
                     "fused, untransposed, gated weights without biases")
    experts = module.num_experts
    if experts % size:
        raise _error(f"autoep_size {size} does not divide {path}'s {experts} experts; "
                     "allowed: a divisor of the number of experts")
    local = experts // size
    first = place * local
    for attr in ("gate_up_proj", "down_proj"):
        whole = getattr(module, attr)
        built_sharded = is_sharded(whole)  # by zeroshard.init: whole for the slice (a collective)
        if built_sharded:
            Sharder().gather(whole)
        mine = torch.nn.Parameter(whole.detach()[first:first + local].clone(),
                                  requires_grad=whole.requires_grad)
        if built_sharded:
            Sharder().drop(whole)
        mine.allreduce = False  # DeepSpeed's mark of an expert parameter
        mine.group_name = name
        setattr(module, attr, mine)
    module.num_local_experts = local
    module.zeroshard_expert_parallel = (group, size, first, ("gate_up_proj", "down_proj"))
    module.forward = types.MethodType(_exchanged_forward, module)


class _Exchange(torch.autograd.Function):
    """Rows to the group's ranks in `sent` counts, `received` counts back from each; the
    gradient goes the opposite way."""

    @staticmethod
    def forward(ctx, group, rows, received, sent):
        ctx.group, ctx.received, ctx.sent = group, received, sent
        out = rows.new_empty((sum(received),) + tuple(rows.shape[1:]))
        with process_groups.named("the expert exchange (rows)", group):
            dist.all_to_all_single(out, rows.contiguous(), received, sent, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return None, _Exchange.apply(ctx.group, grad, ctx.sent, ctx.received), None, None


def _exchanged_forward(self, hidden_states, top_k_index, top_k_weights):
    group, size, first, _ = self.zeroshard_expert_parallel
    local = self.num_local_experts
    _, k = top_k_index.shape
    routes = top_k_index.reshape(-1)
    order = torch.argsort(routes, stable=True)  # by expert, hence by the rank holding it
    expert = routes[order]
    token = order // k
    owner = expert // local
    sent_counts = torch.bincount(owner, minlength=size)
    received_counts = torch.empty_like(sent_counts)
    with process_groups.named("the expert exchange (row counts)", group):
        dist.all_to_all_single(received_counts, sent_counts, group=group)
    sent, received = sent_counts.tolist(), received_counts.tolist()
    rows = _Exchange.apply(group, hidden_states[token], received, sent)
    which = expert - owner * local  # the expert's place among its rank's
    mine = torch.empty(sum(received), dtype=which.dtype, device=which.device)
    with process_groups.named("the expert exchange (expert places)", group):
        dist.all_to_all_single(mine, which, received, sent, group=group)
    back = _Exchange.apply(group, _local_experts(self, rows, mine), sent, received)
    weighted = back * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    final = torch.zeros_like(hidden_states)
    return final.index_add(0, token, weighted.to(final.dtype))


# torch's grouped GEMM (public in torch 2.10, torch._grouped_mm since 2.8; a CPU kernel
# since 2.9): one call for every expert's rows, where a loop makes two matmuls an expert.
_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm",
                                                                          None)
_GROUPED_ON_CPU = torch.torch_version.TorchVersion(torch.__version__) >= "2.9"


def _grouped_runs(rows, weights):
    """Whether torch's grouped GEMM takes these operands: on CPU float32, bfloat16 and
    float16; on CUDA the bfloat16 its kernels are written for (compute capability 8.0 and
    above); each operand's rows 16-byte aligned, as its kernels require. No rows at all: the
    loop (grouped GEMM's backward refuses an empty operand)."""
    if _GROUPED_MM is None or rows.shape[0] == 0:
        return False
    if rows.device.type == "cpu":
        ok = _GROUPED_ON_CPU and rows.dtype in (torch.float32, torch.bfloat16, torch.float16)
    elif rows.device.type == "cuda":
        ok = rows.dtype == torch.bfloat16 and \
            torch.cuda.get_device_capability(rows.device) >= (8, 0)
    else:
        ok = False
    widths = {rows.shape[-1]} | {n for w in weights for n in w.shape[-2:]}  # H, 2I, I
    return ok and all(w.dtype == rows.dtype for w in weights) \
        and all(t.data_ptr() % 16 == 0 for t in (rows, *weights)) \
        and all(n * rows.element_size() % 16 == 0 for n in widths)


def _gate(self, both):
    """The gated activation of gate_up_proj's output, the model's own where it has one."""
    if hasattr(self, "_apply_gate"):
        return self._apply_gate(both)
    gate, up = both.chunk(2, dim=-1)
    return self.act_fn(gate) * up


def _local_experts(self, rows, mine):
    """This rank's experts on the rows sent to it (`mine`: each row's expert among the
    rank's), in the rows' order. As the model computes them: its config's
    experts_implementation "eager" one matmul pair per expert, otherwise (transformers'
    default, "grouped_mm") torch's grouped GEMM over the rows sorted by expert where torch
    runs it for these operands (_grouped_runs), else the loop."""
    asked = getattr(getattr(self, "config", None), "_experts_implementation", None)
    if asked != "eager" and _grouped_runs(rows, (self.gate_up_proj, self.down_proj)):
        order = torch.argsort(mine, stable=True)
        ends = torch.cumsum(torch.bincount(mine, minlength=self.num_local_experts), 0)
        ends = ends.to(torch.int32)
        inner = _gate(self, _GROUPED_MM(rows[order], self.gate_up_proj.transpose(-2, -1),
                                        offs=ends))
        done = _GROUPED_MM(inner, self.down_proj.transpose(-2, -1), offs=ends)
        return torch.zeros_like(rows).index_copy(0, order, done)
    out = torch.zeros_like(rows)
    # Every expert runs, on no rows too: its weights and `rows` stay in the graph, so every
    # rank's backward runs both exchanges (collectives) even when none of its experts got
    # a token; skipped, that rank's backward would miss them and the others' wait forever.
    for e in range(self.num_local_experts):
        at = torch.nonzero(mine == e).squeeze(-1)
        inner = _gate(self, torch.nn.functional.linear(rows[at], self.gate_up_proj[e]))
        out = out.index_copy(0, at, torch.nn.functional.linear(inner, self.down_proj[e]))
    return out
