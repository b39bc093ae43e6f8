"""Mixtures of experts, their experts split over expert-parallel ranks (the groups:
_common/expert_groups.py), one module per way a model holds them:
- expert_parallel, moe_gating: DeepSpeed's MoE layer (zeroshard.moe) and its gating;
- hf_expert_parallel: a Hugging Face model's fused experts split by AutoEP's keys;
- dtensor_experts: experts the user distributed as DTensors on a mesh's ep dimension;
- expert_state: the whole model's experts joined from every rank (state_dict, saving).
May import: _common, _activations, _parallel and the C++ extension."""
