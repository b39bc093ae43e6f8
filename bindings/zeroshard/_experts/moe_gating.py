"""DeepSpeed's MoE gating (deepspeed.moe.sharded_moe's top1gating, top2gating and
topkgating, GShard's scheme): which expert each token goes to, where in the expert's
capacity it lands, and with what weight; the load-balancing loss l_aux and the experts'
token counts.

Each function returns the routes in the sparse form DeepSpeed's MOELayer uses:
(l_aux, capacity, num_experts, indices [k, S] (-1: the route was dropped), locations
[k, S], gate weights [k, S], exp_counts [E]). The random draws (RSample's Gumbel noise,
Jitter's multiplicative noise, random token selection's uniform scores, top-2's
second-expert sampling) come from torch's generator through torch.distributions, in
DeepSpeed's order, so a seeded run draws what DeepSpeed's draws. Ops whose ties or
rounding decide a route (topk over int64 masks, the capacity's float32 ceil) are taken in
the same dtypes for the same reason.

Capacities count this rank's tokens; without drop_tokens the largest count over the
expert-parallel group is taken (an all-reduce MAX), as DeepSpeed takes it."""
import torch
import torch.nn.functional as F

from .. import _zeroshard
from .._common import process_groups

_SAMPLERS = {}  # (kind, device, low, high): the distribution's rsample


def _sampler(kind, device, low, high):
    key = (kind, device, low, high)
    if key not in _SAMPLERS:
        lo, hi = torch.tensor(low, device=device), torch.tensor(high, device=device)
        dist = (torch.distributions.gumbel.Gumbel(lo, hi) if kind == "gumbel"
                else torch.distributions.uniform.Uniform(lo, hi))
        _SAMPLERS[key] = dist.rsample
    return _SAMPLERS[key]


def gumbel_rsample(shape, device):
    return _sampler("gumbel", device, 0.0, 1.0)(shape)


def multiplicative_jitter(x, device, epsilon=1e-2):
    """x times a uniform draw in [1 - epsilon, 1 + epsilon] per element (noisy_gate_policy
    'Jitter')."""
    if epsilon == 0:
        return x
    return x * _sampler("uniform", device, 1.0 - epsilon, 1.0 + epsilon)(x.shape)


def _uniform(shape, device):
    return _sampler("uniform", device, 0.0, 1.0)(shape)


def capacity_of(gates, capacity_factor, min_capacity):
    """ceil(tokens / experts x capacity_factor), at least min_capacity (float32, as
    DeepSpeed computes it)."""
    tokens, experts = gates.shape
    capacity = torch.ceil((tokens / experts) * torch.tensor(capacity_factor)).to(torch.int64)
    return torch.maximum(capacity, torch.tensor(min_capacity).to(torch.int64))


def _dropless_capacity(exp_counts, ep_group):
    """drop_tokens=False: room for the busiest expert, agreed over the expert-parallel
    group where one is given."""
    capacity = torch.max(exp_counts)
    dist = torch.distributed
    if ep_group is not None and dist.get_world_size(group=ep_group) > 1:
        with process_groups.named("the MoE gate's capacity all-reduce", ep_group):
            dist.all_reduce(capacity, op=dist.ReduceOp.MAX, group=ep_group)
    return capacity


def _dense(routes):
    """DeepSpeed's dense form of the routes: (l_aux, combine_weights [S, E, C], dispatch_mask,
    exp_counts)."""
    l_aux, capacity, experts, indices, locations, weights, exp_counts = routes
    count = indices.shape[1]
    combine = weights.new_zeros(count, experts, int(capacity))
    tokens = torch.arange(count, device=indices.device)
    for r in range(indices.shape[0]):
        kept = indices[r] >= 0
        combine = combine.index_put((tokens[kept], indices[r][kept].long(),
                                     locations[r][kept].long()), weights[r][kept],
                                    accumulate=True)
    return l_aux, combine, combine.bool(), exp_counts


def _no_tutel(use_tutel):
    if use_tutel:
        raise _zeroshard.Error("MoE gating: use_tutel=True: Tutel's kernels are not used "
                               "here; allowed: False")


def top1gating(logits, capacity_factor, min_capacity, used_token=None, noisy_gate_policy=None,
               drop_tokens=True, use_rts=True, ep_group=None, sparse_routes=False,
               use_tutel=False):
    """DeepSpeed's signature; sparse_routes=True gives the routes (see the module's
    docstring), False DeepSpeed's dense (l_aux, combine_weights, dispatch_mask, exp_counts)."""
    _no_tutel(use_tutel)
    routes = _top1(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy,
                   drop_tokens, use_rts, ep_group)
    return routes if sparse_routes else _dense(routes)


def top2gating(logits, capacity_factor, min_capacity, drop_tokens=True, ep_group=None,
               top2_2nd_expert_sampling=True, sparse_routes=False):
    routes = _top2(logits, capacity_factor, min_capacity, drop_tokens, ep_group,
                   top2_2nd_expert_sampling)
    return routes if sparse_routes else _dense(routes)


def topkgating(logits, k, capacity_factor, min_capacity, drop_tokens=True, ep_group=None,
               drop_policy="probs", sparse_routes=False):
    if drop_policy not in ("probs", "position"):
        raise _zeroshard.Error(f"MoE top-k gating: drop_policy {drop_policy!r}; allowed: "
                               "'probs', 'position'")
    routes = _topk(logits, k, capacity_factor, min_capacity, drop_tokens, ep_group, drop_policy)
    return routes if sparse_routes else _dense(routes)


def _top1(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy, drop_tokens,
          use_rts, ep_group):
    """Each token to its best expert (with RSample: best after Gumbel noise); an expert
    over capacity keeps the tokens random token selection ranks first (use_rts) or the
    first ones. Gate weights are the softmax probabilities."""
    if noisy_gate_policy == "RSample":
        noisy = logits + gumbel_rsample(logits.shape, device=logits.device)
    gates = F.softmax(logits, dim=1)
    capacity = capacity_of(gates, capacity_factor, min_capacity)
    indices = torch.argmax(noisy if noisy_gate_policy == "RSample" else gates, dim=1)
    experts = int(gates.shape[1])
    mask = F.one_hot(indices, num_classes=experts)
    if used_token is not None:
        mask = torch.einsum("s,se->se", used_token, mask)
    exp_counts = torch.sum(mask, dim=0).detach().to(logits.device)
    if not drop_tokens:
        capacity = torch.minimum(_dropless_capacity(exp_counts, ep_group),
                                 torch.tensor(mask.size(0)).to(exp_counts.device))
    l_aux = torch.sum(torch.mean(gates, dim=0) * torch.mean(mask.float(), dim=0)) * experts
    ranked = mask * _uniform(mask.shape, logits.device) if use_rts else mask
    if logits.shape[0] < min_capacity:
        raise _zeroshard.Error(
            f"MoE top-1 gating: {logits.shape[0]} tokens, fewer than min_capacity "
            f"{min_capacity}; allowed: min_capacity 0, or a batch of at least {min_capacity} "
            "tokens")
    selection = min(capacity, torch.tensor(mask.size(0)).to(capacity.device))
    kept = torch.topk(ranked, k=selection, dim=0)[1]
    mask = mask * torch.zeros_like(mask).scatter_(0, kept, 1)
    indices = torch.min(indices, mask.sum(dim=1) * experts - 1)  # -1 where dropped
    locations = torch.sum((torch.cumsum(mask, dim=0) - 1) * mask, dim=1)
    weights = (gates * mask).sum(dim=1)
    return (l_aux, capacity, experts, indices.to(torch.int32).unsqueeze(0),
            locations.to(torch.int32).unsqueeze(0), weights.unsqueeze(0), exp_counts)


def _top2(logits, capacity_factor, min_capacity, drop_tokens, ep_group,
          top2_2nd_expert_sampling):
    """Each token to its best expert and to its best other one (after Gumbel noise when
    top2_2nd_expert_sampling); the second choices queue behind every first choice; the
    two weights renormalised to sum to 1."""
    gates = F.softmax(logits, dim=1)
    first = torch.argmax(gates, dim=1)
    experts = int(gates.shape[1])
    mask1 = F.one_hot(first, num_classes=experts)
    if top2_2nd_expert_sampling:
        logits = logits + gumbel_rsample(logits.shape, device=logits.device)
    second = torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(second, num_classes=experts)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1 + torch.sum(mask1, dim=0, keepdim=True)
    l_aux = torch.mean(torch.mean(gates, dim=0) * torch.mean(mask1.float(), dim=0)) \
        * experts * experts
    exp_counts = torch.sum(mask1 + mask2, dim=0).detach().to(logits.device)
    if drop_tokens:
        capacity = capacity_of(gates, capacity_factor * 2, min_capacity)
        mask1 = mask1 * torch.lt(locations1, capacity)
        mask2 = mask2 * torch.lt(locations2, capacity)
    else:
        capacity = _dropless_capacity(exp_counts, ep_group)
    locations1 = torch.sum(locations1 * mask1, dim=1)
    locations2 = torch.sum(locations2 * mask2, dim=1)
    weight1 = torch.einsum("se,se->s", gates, mask1.float())
    weight2 = torch.einsum("se,se->s", gates, mask2.float())
    total = torch.clamp(weight1 + weight2, min=torch.finfo(weight1.dtype).eps)
    weight1, weight2 = weight1 / total, weight2 / total
    first = torch.where(mask1.any(dim=1), first, torch.full_like(first, -1))
    second = torch.where(mask2.any(dim=1), second, torch.full_like(second, -1))
    return (l_aux, capacity, experts, torch.stack([first, second]).to(torch.int32),
            torch.stack([locations1, locations2]).to(torch.int32),
            torch.stack([weight1, weight2]), exp_counts)


def _topk(logits, k, capacity_factor, min_capacity, drop_tokens, ep_group, drop_policy):
    """Each token to its k best experts; an expert over capacity keeps the tokens whose
    weight for it is highest (drop_policy 'probs') or the first ones ('position'); weights
    renormalised over the routes kept."""
    gates = F.softmax(logits, dim=1)
    experts = int(gates.shape[1])
    top_gate, top_idx = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_idx, 1)
    exp_counts = torch.sum(mask, dim=0).detach().to(logits.device)
    l_aux = torch.mean(torch.mean(gates, dim=0) * torch.mean(mask.float(), dim=0)) \
        * experts * experts / k
    if drop_tokens and drop_policy == "probs":
        capacity = capacity_of(gates, capacity_factor * k, min_capacity)
        weighted = torch.zeros_like(gates).scatter(1, top_idx, top_gate)
        selection = min(capacity, torch.tensor(gates.size(0)).to(capacity.device))
        _, kept = torch.topk(weighted, k=selection, dim=0, sorted=False)
        mask &= torch.zeros_like(gates, dtype=torch.bool).scatter_(0, kept, True)
        locations = torch.cumsum(mask, dim=0) - 1
    elif drop_tokens:
        capacity = capacity_of(gates, capacity_factor * k, min_capacity)
        locations = torch.cumsum(mask, dim=0) - 1
        mask *= torch.lt(locations, capacity)
    else:
        capacity = _dropless_capacity(exp_counts, ep_group)
        locations = torch.cumsum(mask, dim=0) - 1
    masked = gates * mask
    masked = masked / torch.clamp(torch.sum(masked, dim=-1, keepdim=True),
                                  min=torch.finfo(masked.dtype).eps)
    route_kept = mask.gather(1, top_idx)
    indices = torch.where(route_kept, top_idx, torch.full_like(top_idx, -1))
    route_locations = locations.gather(1, top_idx) * route_kept
    return (l_aux, capacity, experts, indices.t().contiguous().to(torch.int32),
            route_locations.t().contiguous().to(torch.int32),
            masked.gather(1, top_idx).t().contiguous(), exp_counts)
