"""deepspeed.ops.transformer: DeepSpeedTransformerLayer, DeepSpeed's fused BERT layer, as
the same function in torch's own ops (its parameters, their names and layout, its pre- or
post-LayerNorm order, tanh GELU, an additive [batch, 1, 1, seq] attention mask), so that a
model that swaps it in (DeepSpeedExamples' BERT pre-training) trains under zeroshard, on
any device.

Pre-LN:  h = x + drop(attn(LN_norm(x)));  out = h + drop(ffn(LN_attn(h)))
Post-LN: h = LN_attn(x + drop(attn(x)));  out = LN_norm(h + drop(ffn(h)))
Dropout draws from torch's generator (DeepSpeed's kernel has its own, seeded by `seed`)."""
import json
import math
import warnings

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class TransformerConfig:
    def __init__(self, batch_size, hidden_size, intermediate_size, heads, attn_dropout_ratio,
                 hidden_dropout_ratio, num_hidden_layers, initializer_range):
        self.layer_id = -1
        self.batch_size, self.hidden_size = batch_size, hidden_size
        self.intermediate_size, self.heads = intermediate_size, heads
        self.attn_dropout_ratio, self.hidden_dropout_ratio = attn_dropout_ratio, hidden_dropout_ratio
        self.num_hidden_layers, self.initializer_range = num_hidden_layers, initializer_range


class DeepSpeedTransformerConfig(TransformerConfig):
    """DeepSpeed's arguments and defaults. batch_size (the kernel's largest batch), fp16 (the
    layer computes in its parameters' dtype, which the engine sets) and local_rank (the
    device is set where given) shape DeepSpeed's kernel, not the function; the memory
    switches (normalize_invertible, gelu_checkpoint, attn_dropout_checkpoint) recompute
    that part in backward, as they do there."""

    def __init__(self, batch_size=-1, hidden_size=-1, intermediate_size=-1, heads=-1,
                 attn_dropout_ratio=-1, hidden_dropout_ratio=-1, num_hidden_layers=-1,
                 initializer_range=-1, layer_norm_eps=1e-12, local_rank=-1, seed=-1, fp16=False,
                 pre_layer_norm=True, normalize_invertible=False, gelu_checkpoint=False,
                 adjust_init_range=True, attn_dropout_checkpoint=False, stochastic_mode=False,
                 return_tuple=False, training=True):
        super().__init__(batch_size, hidden_size,
                         intermediate_size if intermediate_size > 0 else 4 * hidden_size, heads,
                         attn_dropout_ratio, hidden_dropout_ratio, num_hidden_layers,
                         initializer_range)
        self.fp16, self.pre_layer_norm, self.local_rank, self.seed = fp16, pre_layer_norm, local_rank, seed
        self.normalize_invertible, self.gelu_checkpoint = normalize_invertible, gelu_checkpoint
        self.adjust_init_range, self.test_gemm, self.layer_norm_eps = adjust_init_range, False, layer_norm_eps
        self.training, self.is_grad_enabled = training, True
        self.attn_dropout_checkpoint, self.stochastic_mode = attn_dropout_checkpoint, stochastic_mode
        self.return_tuple = return_tuple

    @classmethod
    def from_dict(cls, json_object):
        config = cls()
        config.__dict__.update(json_object)
        return config

    @classmethod
    def from_json_file(cls, json_file):
        with open(json_file, "r", encoding="utf-16") as reader:  # DeepSpeed reads UTF-16
            return cls.from_dict(json.loads(reader.read()))


def _maybe_checkpointed(on, function, *args):
    if on and torch.is_grad_enabled():
        return checkpoint(function, *args, use_reentrant=False)
    return function(*args)


class DeepSpeedTransformerLayer(torch.nn.Module):
    """deepspeed.DeepSpeedTransformerLayer(config, initial_weights=None, initial_biases=None)."""
    layer_id = 0

    def __init__(self, config, initial_weights=None, initial_biases=None):
        super().__init__()
        self.config = config
        config.layer_id = DeepSpeedTransformerLayer.layer_id
        DeepSpeedTransformerLayer.layer_id += 1
        if config.stochastic_mode:
            warnings.warn("zeroshard: DeepSpeedTransformerConfig(stochastic_mode=True) picks "
                          "DeepSpeed's faster non-deterministic kernel; here the layer runs "
                          "torch's ops, deterministic either way", stacklevel=2)
        if config.local_rank >= 0 and torch.cuda.is_available():
            torch.cuda.set_device(config.local_rank)
        h, i = config.hidden_size, config.intermediate_size
        new = lambda *shape: torch.nn.Parameter(torch.empty(*shape))  # noqa: E731
        if initial_weights is None and initial_biases is None:
            self.attn_qkvw, self.attn_qkvb = new(3 * h, h), new(3 * h)
            self.attn_ow, self.attn_ob = new(h, h), new(h)
            self.attn_nw, self.attn_nb = new(h), new(h)
            self.inter_w, self.inter_b = new(i, h), new(i)
            self.output_w, self.output_b = new(h, i), new(h)
            self.norm_w, self.norm_b = new(h), new(h)
            self.init_transformer_weights(config.adjust_init_range)
            return
        # DeepSpeed's test interface: [q, k, v, attn_o, attn_norm, inter, output, norm].
        q, k, v = (w.data for w in initial_weights[:3])
        self.attn_qkvw = torch.nn.Parameter(torch.cat((q, k, v)))
        self.attn_qkvb = torch.nn.Parameter(torch.zeros(3 * h))
        self.attn_ow, self.attn_nw, self.inter_w = initial_weights[3:6]
        self.output_w, self.norm_w = initial_weights[6:8]
        self.attn_ob, self.attn_nb, self.inter_b = initial_biases[3:6]
        self.output_b, self.norm_b = initial_biases[6:8]

    def init_transformer_weights(self, adjust_init_range=False):
        c = self.config
        std = c.initializer_range
        output_std = std / math.sqrt(2.0 * c.num_hidden_layers) if adjust_init_range else std
        with torch.no_grad():
            for w, s in ((self.attn_qkvw, std), (self.attn_ow, output_std),
                         (self.inter_w, std), (self.output_w, output_std)):
                w.normal_(mean=0.0, std=s)
            for b in (self.attn_qkvb, self.attn_ob, self.attn_nb, self.inter_b, self.output_b,
                      self.norm_b):
                b.zero_()
            self.attn_nw.fill_(1.0)
            self.norm_w.fill_(1.0)

    def _norm(self, x, weight, bias):
        return _maybe_checkpointed(self.config.normalize_invertible, F.layer_norm, x,
                                   (x.shape[-1],), weight, bias, self.config.layer_norm_eps)

    def _attention(self, x, mask):
        c, (b, s, h) = self.config, x.shape
        heads = c.heads
        q, k, v = F.linear(x, self.attn_qkvw, self.attn_qkvb).split(h, dim=-1)
        q, k, v = (t.view(b, s, heads, h // heads).transpose(1, 2) for t in (q, k, v))
        p = c.attn_dropout_ratio if self.training else 0.0

        def attend(q, k, v, mask):
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(h // heads)
            if mask is not None:
                scores = scores + mask.to(scores.dtype)
            return F.dropout(scores.softmax(-1), p, self.training) @ v

        out = _maybe_checkpointed(c.attn_dropout_checkpoint, attend, q, k, v, mask)
        return F.linear(out.transpose(1, 2).reshape(b, s, h), self.attn_ow)

    def _feed_forward(self, x):
        gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731  (DeepSpeed's kernel's)
        inner = _maybe_checkpointed(self.config.gelu_checkpoint, gelu,
                                    F.linear(x, self.inter_w, self.inter_b))
        return F.linear(inner, self.output_w)

    def forward(self, hidden_states, attention_mask=None, head_mask=None, layer_head_mask=None,
                encoder_hidden_states=None, encoder_attention_mask=None, past_key_value=None,
                output_attentions=False, grads=None):
        c, p = self.config, self.config.hidden_dropout_ratio
        drop = lambda t, bias: F.dropout(t + bias, p, self.training)  # noqa: E731
        x = hidden_states
        if c.pre_layer_norm:
            h = x + drop(self._attention(self._norm(x, self.norm_w, self.norm_b), attention_mask),
                         self.attn_ob)
            out = h + drop(self._feed_forward(self._norm(h, self.attn_nw, self.attn_nb)),
                           self.output_b)
        else:
            h = self._norm(x + drop(self._attention(x, attention_mask), self.attn_ob),
                           self.attn_nw, self.attn_nb)
            out = self._norm(h + drop(self._feed_forward(h), self.output_b), self.norm_w,
                             self.norm_b)
        return (out,) if c.return_tuple else out
