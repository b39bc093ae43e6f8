"""Ulysses sequence parallelism inside a Hugging Face model, with the names of DeepSpeed's
ALST (zeroshard.runtime.sequence_parallel.ulysses_sp): UlyssesSPAttentionHF takes the place
of the model's attention function in transformers' registry, so every attention layer of
every model built with that implementation runs on whole sequences with 1/p of the heads
while the rest of the model runs on the rank's slice of the sequence.

transformers hands the attention function query, key and value as [b, heads, s/p, d] (the
rotary embedding already applied from the batch's position ids, which the data-loader
adapter sliced from the whole sequence's). The exchange is sequence_parallel.py's
all-to-all; key-value heads fewer than the ranks are repeated first, as DeepSpeed repeats
them, so that each rank has the key-value head of its query heads. The model's own
attention mask is dropped: it was made for the slice, and the attention is causal over the
whole sequence (the core function's is_causal), as with DeepSpeed; packed sequences and
padding masks are therefore not expressed, and implementations that need a mask (eager) are
refused."""
import torch
import torch.distributed as dist

from .. import _zeroshard
from .._common import process_groups
from . import sequence_groups as _sequence_groups
from .sequence_parallel import _SeqAllToAll

_MASKED = ("eager", "paged|eager")  # they need a 4-D mask over the whole sequence
_replaced = {}  # attention implementation -> the function it named before registration


def _error(message):
    return _zeroshard.Error(f"UlyssesSPAttentionHF: {message}")


class UlyssesSPAttentionHF(torch.nn.Module):
    """DeepSpeed's UlyssesSPAttentionHF(attn, batch_size, attn_head_count, attn_head_size,
    kv_head_count, num_hidden_layers, process_group, seq_length_is_variable=False,
    local_seq_length=None, global_seq_length=None, disable_in_eval=False): called as
    transformers calls an attention function, (module, query, key, value, attention_mask,
    *args, **kwargs) -> (output [b, s/p, heads * d], weights)."""

    def __init__(self, attn, batch_size, attn_head_count, attn_head_size, kv_head_count,
                 num_hidden_layers, process_group, seq_length_is_variable=False,
                 local_seq_length=None, global_seq_length=None, disable_in_eval=False):
        super().__init__()
        self.attn = attn
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.sp_rank = dist.get_rank(process_group)
        self.batch_size = batch_size
        self.attn_head_count, self.attn_head_size = attn_head_count, attn_head_size
        self.global_kv_head_count = kv_head_count
        self.num_hidden_layers = num_hidden_layers
        self.seq_length_is_variable = seq_length_is_variable
        self.local_seq_length, self.global_seq_length = local_seq_length, global_seq_length
        self.disable_in_eval = disable_in_eval
        self.core_attn_implementation = None
        p = self.world_size
        if attn_head_count % p:
            raise _error(f"{attn_head_count} attention heads do not split over a "
                         f"sequence-parallel group of {p} ranks; allowed: a head count "
                         f"divisible by {p}")
        if kv_head_count % p and p % kv_head_count:
            raise _error(f"{kv_head_count} key-value heads over a sequence-parallel group of "
                         f"{p} ranks; allowed: a count that divides by {p} or divides {p}")
        self.local_q_head_count = attn_head_count // p
        # Fewer key-value heads than ranks: each is repeated to one per rank.
        self.kv_replication_factor = max(1, p // kv_head_count)
        self.local_kv_head_count = max(1, kv_head_count // p)

    def _check_length(self, local):
        if not self.seq_length_is_variable and local != self.local_seq_length:
            raise _error(f"a slice of {local} tokens, where registration said "
                         f"seq_length={self.global_seq_length} ({self.local_seq_length} a rank) "
                         "with seq_length_is_variable=False; allowed: slices of that length, "
                         "or seq_length_is_variable=True")

    def _whole_positions(self, kwargs):
        positions = kwargs.get("position_ids")
        if positions is None:
            raise _error("the forward has no position_ids; each rank's slice needs its "
                         "tokens' positions in the whole sequence (UlyssesSPDataLoaderAdapter "
                         "adds them); allowed: position_ids in every forward")
        slices = [torch.empty_like(positions) for _ in range(self.world_size)]
        with process_groups.named("the position ids' all-gather", self.process_group):
            dist.all_gather(slices, positions.contiguous(), group=self.process_group)
        return torch.cat(slices, dim=-1)

    def forward(self, module, query, key, value, attention_mask, *args, **kwargs):
        if self.disable_in_eval and not module.training:
            return self.attn(module, query, key, value, attention_mask, *args, **kwargs)
        self._check_length(query.shape[2])
        if self.kv_replication_factor > 1:
            key, value = (t.repeat_interleave(self.kv_replication_factor, dim=1)
                          for t in (key, value))
        kwargs["position_ids"] = self._whole_positions(kwargs)
        # [b, h, s/p, d] -> [b, s/p, h, d]: the exchange's batch-first layout.
        q, k, v = (_SeqAllToAll.apply(self.process_group, t.transpose(1, 2), 2, 1, 0)
                   for t in (query, key, value))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, h/p, s, d]
        groups = getattr(module, "num_key_value_groups", None)
        if groups is not None:  # the query heads per key-value head this rank now holds
            module.num_key_value_groups = q.shape[1] // k.shape[1]
        try:
            context, weights = self.attn(module, q, k, v, None, *args, **kwargs)
        finally:
            if groups is not None:
                module.num_key_value_groups = groups
        # [b, s, h/p, d] -> [b, s/p, h, d] -> [b, s/p, h * d]
        out = _SeqAllToAll.apply(self.process_group, context.contiguous(), 1, 2, 0)
        return out.flatten(2), weights

    @classmethod
    def register_with_transformers(cls, model_name_or_path, core_attn_implementation,
                                   sequence_parallel_size, micro_batch_size, seq_length=None,
                                   seq_length_is_variable=True, disable_in_eval=False,
                                   max_length=None):
        """Makes the sequence-parallel groups and puts Ulysses around transformers'
        `core_attn_implementation` (every model built with it, or this model, which must
        already use it); returns the groups' mpu for initialize(mpu=...), or None when
        sequence_parallel_size is 1. model_name_or_path: a model (or an object with its
        config), or a name or path AutoConfig reads."""
        if sequence_parallel_size == 1:
            return None
        seq_length = seq_length if seq_length is not None else max_length
        if not seq_length_is_variable and seq_length is None:
            raise _error("seq_length_is_variable=False and no seq_length; allowed: the fixed "
                         "sequence length, or seq_length_is_variable=True")
        if core_attn_implementation in _MASKED:
            raise _error(f"core_attn_implementation={core_attn_implementation!r} needs a "
                         "4-D attention mask over the whole sequence; allowed: 'sdpa', a "
                         "flash-attention implementation, or another that is causal without one")
        if core_attn_implementation == "flex_attention":
            raise _error("core_attn_implementation='flex_attention' (a block mask rebuilt for "
                         "the whole sequence) is not in zeroshard; allowed: 'sdpa' or a "
                         "flash-attention implementation")
        from transformers import AutoConfig
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        if core_attn_implementation in _replaced:
            raise _error(f"{core_attn_implementation!r} is registered already; call "
                         "unregister_from_transformers(core_attn_implementation) first")
        if core_attn_implementation not in ALL_ATTENTION_FUNCTIONS:
            raise _error(f"core_attn_implementation={core_attn_implementation!r}; allowed: "
                         f"{', '.join(sorted(ALL_ATTENTION_FUNCTIONS.valid_keys()))}")
        loaded = hasattr(model_name_or_path, "config")
        config = (model_name_or_path.config if loaded
                  else AutoConfig.from_pretrained(model_name_or_path))
        model_attn = getattr(config, "_attn_implementation", None) if loaded else None
        if model_attn is not None and model_attn != core_attn_implementation:
            raise _error(f"core_attn_implementation={core_attn_implementation!r}, but the "
                         f"model attends with {model_attn!r}; allowed: the model's own")
        arch = config.get_text_config()
        if seq_length is not None and seq_length % sequence_parallel_size:
            raise _error(f"seq_length={seq_length} does not split over "
                         f"{sequence_parallel_size} ranks; allowed: a multiple of "
                         f"{sequence_parallel_size}")
        if not _sequence_groups.made_with(sequence_parallel_size):
            _sequence_groups.initialize_sequence_parallel(sequence_parallel_size)
        heads = arch.num_attention_heads
        uattn = cls(
            ALL_ATTENTION_FUNCTIONS[core_attn_implementation], micro_batch_size, heads,
            getattr(arch, "head_dim", None) or arch.hidden_size // heads,
            getattr(arch, "num_key_value_heads", None) or heads, arch.num_hidden_layers,
            _sequence_groups.get_sequence_parallel_group(), seq_length_is_variable,
            None if seq_length is None else seq_length // sequence_parallel_size, seq_length,
            disable_in_eval)
        uattn.core_attn_implementation = core_attn_implementation

        def ulysses_attention(module, query, key, value, attention_mask, *args, **kwargs):
            return uattn(module, query, key, value, attention_mask, *args, **kwargs)

        _replaced[core_attn_implementation] = ALL_ATTENTION_FUNCTIONS[core_attn_implementation]
        ALL_ATTENTION_FUNCTIONS[core_attn_implementation] = ulysses_attention
        return _sequence_groups.mpu()

    @classmethod
    def unregister_from_transformers(cls, core_attn_implementation):
        """Gives transformers back its own `core_attn_implementation`."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        if core_attn_implementation not in _replaced:
            raise _error(f"{core_attn_implementation!r} was not registered; allowed: "
                         f"{sorted(_replaced) or 'none is'}")
        ALL_ATTENTION_FUNCTIONS[core_attn_implementation] = _replaced.pop(
            core_attn_implementation)
