"""The batch a model trains on, told to the engine so that memory_report()'s prediction
counts activations beside the model states (plan/MemoryModel.cpp activation_bytes): for a
Hugging Face model whose family the estimator reads, from its config, the attention it
was built with, gradient checkpointing, and the largest micro-batch (sequences x tokens)
of a forward with gradients so far. Other models keep a prediction of model states.
Before any forward, the batch offload_optimizer.ratio auto leaves room for (the model's
longest sequence), and what it chose."""
import copy

import torch


class ActivationShape:
    def __init__(self, engine, model, sequence_parallel=1):
        self._engine, self._model = engine, model
        # Each rank's forward sees its slice of every sequence; the plan divides the whole.
        self._sequence_parallel = max(1, int(sequence_parallel))
        config = getattr(model, "config", None)
        self._config = config if hasattr(config, "to_json_string") else None
        self._largest = 0
        self.unread = None  # why the config could not be read, where it could not
        self.told = 0  # batches told to the engine so far: what it plans from changes with it

    def observe(self, args, kwargs):
        """A forward begins: its batch, if larger than any before it."""
        if self._config is None or not torch.is_grad_enabled():
            return
        tokens = kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if tokens is None and args:
            tokens = args[0]
        if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2:
            return
        batch, seq = int(tokens.shape[0]), int(tokens.shape[1])
        if batch * seq <= self._largest:
            return
        self._largest = batch * seq
        try:
            hf_json, attention, recomputed = model_shape(self._model, self._config)
            self._engine.set_activation_shape(hf_json, attention, seq * self._sequence_parallel,
                                              batch, recomputed,
                                              makes_logits(self._model, self._config))
            self.told += 1
        except RuntimeError as e:  # a family the estimator does not read: model states alone
            self._config, self.unread = None, str(e)


def model_shape(model, config):
    """What the engine and the estimate read a Hugging Face model's activations from: its
    config as JSON, the attention it was built with, and whether it recomputes layers. A
    model holding fewer decoder layers than its config counts (a pipeline stage cut from
    it) is read with the layers it holds."""
    held = decoder_layers(model)
    if 0 < held < getattr(config, "num_hidden_layers", 0):
        config = copy.deepcopy(config)
        config.num_hidden_layers = held
    return (config.to_json_string(use_diff=False),
            getattr(config, "_attn_implementation", None) or "sdpa",
            bool(getattr(model, "is_gradient_checkpointing", False)))


def decoder_layers(model):
    """The transformers decoder layers the model holds (0 where this transformers has no
    common class for them)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return 0
    return sum(1 for m in model.modules() if isinstance(m, GradientCheckpointingLayer))


def makes_logits(model, config):
    """Whether the model ends in the vocabulary's logits: its output embeddings where it
    names them (None: a base model, or a pipeline stage before the last), else a linear
    layer onto the vocabulary inside it."""
    if callable(getattr(model, "get_output_embeddings", None)):
        return model.get_output_embeddings() is not None
    vocab = getattr(config, "vocab_size", None)
    return any(isinstance(m, torch.nn.Linear) and m.out_features == vocab
               for m in model.modules())


def assumed_batch(model):
    """The batch `offload_optimizer.ratio: auto` leaves room for on the device before any
    forward (engine/EnginePlan.h): the model's longest sequence
    (config.max_position_embeddings), its attention and gradient checkpointing; the
    micro-batch is the config's. None where the model has no such config."""
    config = getattr(model, "config", None)
    if not hasattr(config, "to_json_string"):
        return None
    seq = getattr(config, "max_position_embeddings", None)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return None
    hf_json, attention, recomputed = model_shape(model, config)
    return hf_json, attention, seq, "model.config.max_position_embeddings", recomputed


def say_offload_ratio(engine):
    """What offload_optimizer.ratio auto decided and for which batch, on rank 0: where it
    splits the optimizer decides what fits on the device (engine/EnginePlan.h)."""
    if engine.rank != 0:
        return
    for line in engine.plan_reasons:
        if line.startswith("zero_optimization.offload_optimizer.ratio: auto"):
            print(f"zeroshard: {line}", flush=True)
