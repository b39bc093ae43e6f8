"""What the long-sequence scripts (alst_script.py, cp_script.py) train and compare with: a
small transformers Llama (4 query heads, 2 key-value heads, sdpa), its samples, and the
same model trained on whole sequences in one process with torch's AdamW."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

STEPS, SEQ, LR = 4, 16, 1e-3
CONFIG = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def make_model():
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(CONFIG, attn_implementation="sdpa")


def samples(count):
    torch.manual_seed(5)
    return torch.randint(0, CONFIG.vocab_size, (count, SEQ))


def zero_config(case):
    """The zero_optimization section of a case: a stage ("1".."3"), "3cpu" with the
    optimizer and parameters offloaded to the CPU."""
    zero = {"stage": int(case[0])}
    if case.endswith("cpu"):
        zero.update(offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"})
    return zero


def grad_norm(params):
    return torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()


def reference(ids, step_samples):
    """Whole sequences, each step's batch the samples step_samples(step) names (the mean of
    their losses, as the engine averages the data-parallel groups' gradients): each
    sample's loss per step, the gradient norms, the parameters after the last step."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        opt.zero_grad()
        each = [model(input_ids=ids[i][None], labels=ids[i][None]).loss
                for i in step_samples(step)]
        (sum(each) / len(each)).backward()
        norms.append(grad_norm(model.parameters()))
        opt.step()
        losses.append([loss.item() for loss in each])
    return losses, norms, dict(model.named_parameters())
