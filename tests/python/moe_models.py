"""Small transformers 5 mixture-of-experts models from configs, the same on every rank
(seed 0, sdpa): Mixtral (4 experts), Qwen3-MoE (8) and Qwen2-MoE (4 and a shared expert),
top 2, fused 3-D experts. Shared by
the expert-parallel scripts (moe_ep_script.py, autoep_script.py)."""
import torch
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

SHAPE = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "mixtral": lambda width: MixtralConfig(intermediate_size=width, num_local_experts=4,
                                           num_experts_per_tok=2, **SHAPE),
    "qwen3_moe": lambda width: Qwen3MoeConfig(moe_intermediate_size=width, intermediate_size=32,
                                              num_experts=8, num_experts_per_tok=2,
                                              norm_topk_prob=True, **SHAPE),
    # a shared expert beside the routed ones, its output gated (shared_expert_gate)
    "qwen2_moe": lambda width: Qwen2MoeConfig(moe_intermediate_size=width, intermediate_size=32,
                                              shared_expert_intermediate_size=32, num_experts=4,
                                              num_experts_per_tok=2, **SHAPE),
}
CLASSES = {"mixtral": MixtralForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM,
           "qwen2_moe": Qwen2MoeForCausalLM}


def make(kind, width=32):
    """The model `kind` with experts `width` wide (their intermediate size)."""
    torch.manual_seed(0)
    return CLASSES[kind]._from_config(CONFIGS[kind](width), attn_implementation="sdpa")
