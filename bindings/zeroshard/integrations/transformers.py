"""zeroshard.integrations.transformers.ZeroShardTrainer: the Hugging Face Trainer, trained by
zeroshard's engine. A Trainer script switches with one import:

    from zeroshard.integrations import ZeroShardTrainer as Trainer

and its DeepSpeed config, given as DeepSpeed Trainer scripts give it (`--deepspeed
ds_config.json`, TrainingArguments.deepspeed), or as `zeroshard_config="ds_config.json"`
(DeepSpeed's keys either way), is the engine's; without one the planner picks the stage.

How the Trainer and the engine share the work (the Trainer's loop is kept whole):
- The Trainer builds its optimizer (AdamW over its decay and no-decay groups) and its
  LR scheduler from TrainingArguments, as always. The engine takes the optimizer over
  (initialize(optimizer=...)); the scheduler sets the real groups' lr, which the engine
  reads before each step. A config 'optimizer' section replaces the Trainer's optimizer
  (its 'auto' values from TrainingArguments); a config 'scheduler' is refused: the
  Trainer's lr_scheduler_type and warmup drive the lr.
- Config values the Trainer also has are filled from TrainingArguments where missing or
  'auto' (train_micro_batch_size_per_gpu, gradient_accumulation_steps,
  gradient_clipping, bf16, fp16), as Hugging Face does for DeepSpeed; a value that
  contradicts TrainingArguments is an error naming both.
- The Trainer's own training_step computes the loss (num_items_in_batch across the
  accumulated micro-batches and, with average_tokens_across_devices, across ranks, as
  it does for DDP); the backward it hands to accelerate goes to engine.backward and
  engine.step (which steps at the accumulation boundary, clipping included); the
  Trainer's optimizer.step() is then a no-op and its grad norm is the engine's.
- TrainingArguments.parallelism_config: ParallelismConfig(sp_backend='deepspeed', sp_size=N)
  is ALST's path as the Trainer's DeepSpeed path takes it (Ulysses registered with
  transformers, the loader adapted, each slice's loss weighted by its tokens over the
  group); ParallelismConfig(cp_size=N) is torch's ring attention as its FSDP2 path takes it
  (accelerate's mesh to the engine, the Trainer's own context-parallel inputs and loss,
  weighted as FSDP2 weighs it: _context_parallel.py); tp_size is refused by name.
- save_model writes Hugging Face's layout through engine.save_pretrained; the
  Trainer's checkpoints (save_strategy) hold the engine's sharded checkpoint in
  checkpoint-N/zeroshard/ and resume from it.
torch.distributed, which accelerate initialises, and the engine share the rendezvous
store (zeroshard joins it)."""
import os

import torch

from .._common import config as _config
from .. import _zeroshard
from .._engine.engine import EngineModule
from .._engine.initialize import initialize
from .._parallel import placement as _placement
from . import _context_parallel, _ulysses

_SCHEDULER_FILE = "scheduler.pt"


def _error(message):
    return _zeroshard.Error(f"ZeroShardTrainer: {message}")


def _fill_optimizer(config, args, origin):
    """Adam's and AdamW's params from TrainingArguments where missing or 'auto'; a
    torch.optim class takes its own keyword arguments, so only those written 'auto'."""
    params = config["optimizer"].setdefault("params", {})
    adam = config["optimizer"].get("type", "AdamW") in ("Adam", "AdamW")
    for key, value in (("lr", args.learning_rate), ("weight_decay", args.weight_decay),
                       ("betas", [args.adam_beta1, args.adam_beta2]), ("eps", args.adam_epsilon)):
        if params.get(key) == "auto" or (adam and key not in params):
            params[key] = value


def trainer_config(config, args):
    """zeroshard's config for a Trainer run: `config` with the values TrainingArguments
    also holds filled in and checked."""
    config, origin = _config.as_mapping(config)
    if "scheduler" in config:
        raise _error(f"{origin}: a 'scheduler' section is not allowed with the Trainer; its "
                     "lr_scheduler_type, warmup_steps and learning_rate drive every group's lr")
    _config.fill(config, "train_micro_batch_size_per_gpu", args.per_device_train_batch_size,
          "TrainingArguments.per_device_train_batch_size", origin)
    _config.fill(config, "gradient_accumulation_steps", args.gradient_accumulation_steps,
          "TrainingArguments.gradient_accumulation_steps", origin)
    _config.fill(config, "gradient_clipping", float(args.max_grad_norm), "TrainingArguments.max_grad_norm",
          origin)
    _config.fill(config, "bf16.enabled", bool(args.bf16), "TrainingArguments.bf16", origin)
    _config.fill(config, "fp16.enabled", bool(args.fp16), "TrainingArguments.fp16", origin)
    if "optimizer" in config:
        _fill_optimizer(config, args, origin)
    return config


def _shard_over_data_parallel(loader, tp, rank, world):
    """accelerate's prepared `loader`, sharded over the world / tp data-parallel ranks."""
    if type(loader).__name__ == "DataLoaderDispatcher":
        raise _error(f"tensor_parallel.autotp_size {tp} with batches dispatched from rank 0 "
                     "(accelerator_config.dispatch_batches, the default for iterable datasets): "
                     "they would differ across tensor-parallel ranks; allowed: "
                     "accelerator_config={'dispatch_batches': False}")
    for shard in (getattr(loader, "batch_sampler", None), getattr(loader, "dataset", None)):
        if hasattr(shard, "num_processes") and hasattr(shard, "process_index"):
            shard.num_processes, shard.process_index = world // tp, rank // tp


def _take_deepspeed_config(args, zeroshard_config):
    """The config a DeepSpeed Trainer script gives (TrainingArguments.deepspeed: its
    --deepspeed ds_config.json, a path or a dict) becomes the engine's, and the Trainer is
    left without DeepSpeed (its plugin, and the global that makes transformers build
    models for DeepSpeed's ZeRO-3). Without either, DeepSpeed's defaults with the stage
    left to the planner (the one that fits, as `zeroshard-estimate` says)."""
    given = getattr(args, "deepspeed", None) if args is not None else None
    if given and zeroshard_config is not None:
        raise _error("both zeroshard_config and TrainingArguments.deepspeed are given; allowed: "
                     "one of them (the same DeepSpeed keys either way)")
    if given:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config
        args.deepspeed, args.deepspeed_plugin = None, None
        if hasattr(args, "hf_deepspeed_config"):
            args.hf_deepspeed_config = None
        unset_hf_deepspeed_config()
        if "_setup_devices" in vars(args):  # a process state made for DeepSpeed (GPU runs):
            del vars(args)["_setup_devices"]  # made again now, before the Trainer's Accelerator
            args.distributed_state = None
            _ = args._setup_devices
        return given
    if zeroshard_config is None:
        return {"zero_optimization": {"stage": "auto"}}
    return zeroshard_config


class ZeroShardTrainerMixin:
    """What puts a Trainer on the engine, ahead of any Trainer class in the MRO (see
    zeroshard_trainer): the engine starts where the Trainer would wrap the model for
    DDP, takes its backward, its clipping and its saving, and leaves the rest of the
    class (its loss, its data, its metrics) as it is."""

    def __init__(self, *args, zeroshard_config=None, units=None, **kwargs):
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is not None and getattr(training_args, "fsdp", None):
            raise _error("TrainingArguments.fsdp is set; zeroshard does the sharding here: leave "
                         "fsdp unset and give the config as zeroshard_config (DeepSpeed's keys)")
        _ulysses.check(getattr(training_args, "parallelism_config", None), _error)
        zeroshard_config = _take_deepspeed_config(training_args, zeroshard_config)
        super().__init__(*args, **kwargs)
        self.zeroshard_config = zeroshard_config
        self.zeroshard_units = units
        self.zeroshard_engine = None
        self._tensor_parallel_size = None  # tensor_parallel.autotp_size, once read
        self.zeroshard_reference_engine = None  # TRL's ref_model at stage 3
        self._engine_module = None
        # The engine places parameters and optimizer state; accelerate would read the
        # sharded optimizer's state_dict to move it (batches are placed by the Trainer).
        self.accelerator.device_placement = False
        # TrainingArguments.parallelism_config: its DeepSpeed sequence parallelism is the
        # engine's. The Trainer adapts its loader through the Accelerator, after the model
        # (the groups exist then), and weighs the loss in compute_loss below.
        parallelism = self.args.parallelism_config
        if _ulysses.size(parallelism) > 1:
            self.accelerator.deepspeed_ulysses_dl_adapter = \
                lambda loader, model: _ulysses.adapted(parallelism, loader, self.args.device)

    def create_accelerator_and_postprocess(self):
        """The Trainer's Accelerator, with TrainingArguments.parallelism_config given to it
        after it is made, as zeroshard's Accelerator takes it: accelerate's own check takes
        a parallelism_config for FSDP2, DeepSpeed or GPUs only (not CPU ranks), and its
        DeepSpeed sequence parallelism builds no mesh either."""
        parallelism = self.args.parallelism_config
        self.args.parallelism_config = None
        try:
            super().create_accelerator_and_postprocess()
        finally:
            self.args.parallelism_config = parallelism
        if parallelism is not None:
            self.accelerator.state.parallelism_config = parallelism
            _context_parallel.set_up(self.accelerator, parallelism, _error)

    def _start_engine(self):
        config = trainer_config(self.zeroshard_config, self.args)
        client = None if "optimizer" in config else self.optimizer
        parallelism = self.args.parallelism_config
        mpu = _ulysses.register(parallelism, self.model, config, "zeroshard_config", _error) \
            if _ulysses.size(parallelism) > 1 else None
        mesh = _context_parallel.prepare(self.accelerator, self.model)
        with _placement.chosen(self.args.device):  # use_cpu, or the Trainer's GPU
            engine, optimizer, _, _ = initialize(model=self.model, config=config,
                                                 optimizer=client, units=self.zeroshard_units,
                                                 mpu=mpu, mesh=mesh)
        optimizer.stepped_by_engine = True  # see ZeroShardOptimizer.step
        # The Trainer's training_step runs as it is (its loss arithmetic below); where it
        # hands the loss to accelerate, the engine takes it.
        self.accelerator.backward = self._engine_backward
        self.zeroshard_engine = engine
        self._engine_module = EngineModule(engine)
        if self.args.torch_compile:  # what accelerate's prepare would do, which is skipped
            self._engine_module = torch.compile(
                self._engine_module, backend=self.args.torch_compile_backend or "inductor",
                mode=self.args.torch_compile_mode)
        self.optimizer = optimizer
        self._shard_reference_model(config)

    def _shard_reference_model(self, config):
        """TRL's reference model (DPOTrainer's and the like: a frozen copy of the policy,
        read without gradients) sharded at stage 3 as the policy is, by an engine of its
        own with nothing to train, as TRL shards it under DeepSpeed's ZeRO-3; at stages
        0-2 it stays whole on every rank, as it does there."""
        reference = getattr(self, "ref_model", None)
        if not isinstance(reference, torch.nn.Module):
            return
        if self.zeroshard_engine.zero_optimization_stage() != 3:
            return
        if getattr(self.args, "sync_ref_model", False):
            raise _error("sync_ref_model=True mixes the policy's weights into the reference "
                         "model's, and at stage 3 both are sharded: leave sync_ref_model off, "
                         "or train at stage 2 or below (the reference model stays whole there)")
        reference.requires_grad_(False)
        settings = {k: v for k, v in config.items() if k != "optimizer"}
        with _placement.chosen(self.args.device):
            self.zeroshard_reference_engine = initialize(model=reference, config=settings)[0]

    def _get_dataloader(self, *args, **kwargs):
        """With tensor parallelism every rank of a tp group takes the same batches:
        accelerate's shard is over the data-parallel ranks alone (rank // tp of world / tp),
        as accelerate does for a ("dp", "tp") device mesh."""
        loader = super()._get_dataloader(*args, **kwargs)
        if self._tensor_parallel_size is None:  # the config parsed once, at the first loader
            self._tensor_parallel_size = _config.parse(
                trainer_config(self.zeroshard_config, self.args)).tensor_parallel_size
        tp = self._tensor_parallel_size
        if tp > 1:
            _shard_over_data_parallel(loader, tp, self.args.process_index, self.args.world_size)
        return loader

    def _wrap_model(self, model, training=True, dataloader=None):
        if self.zeroshard_engine is None:
            if self.optimizer is None:
                self.create_optimizer()
            self._start_engine()
        return self._engine_module

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None,
                        **gen_kwargs):
        """Seq2SeqTrainer's generation with synced_gpus where the engine shards the
        parameters across ranks (see the engine's generate): it passes synced_gpus itself,
        True only under DeepSpeed's ZeRO-3 or FSDP."""
        engine = self.zeroshard_engine
        if (getattr(self.args, "predict_with_generate", False) and not prediction_loss_only
                and engine is not None and engine.zero_optimization_stage() == 3
                and engine.world_size > 1):
            if not gen_kwargs:  # Seq2SeqTrainer's rule: evaluate()'s and predict()'s
                gen_kwargs = dict(getattr(self, "_gen_kwargs", {}))
            gen_kwargs.setdefault("synced_gpus", True)
        return super().prediction_step(model, inputs, prediction_loss_only,
                                       ignore_keys=ignore_keys, **gen_kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """With sequence parallelism, training: the model's loss over this rank's slice
        (shift_labels, which the adapted loader made) weighted by its target tokens over the
        group, as the Trainer's DeepSpeed path computes it from DeepSpeed's groups (the
        engine's are zeroshard's); the Trainer's own otherwise."""
        if _ulysses.size(self.args.parallelism_config) <= 1 or not model.training:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        if "labels" not in inputs and "shift_labels" in inputs:
            inputs["labels"] = inputs["shift_labels"]  # the model computes a loss with labels
        outputs = model(**inputs)
        loss = _ulysses.group_loss(outputs.loss, inputs["shift_labels"])
        return (loss, outputs) if return_outputs else loss

    def _engine_backward(self, loss, **kwargs):
        """accelerator.backward, as Trainer.training_step calls it, with the loss it made
        for DDP: each micro-batch's token sum over the window's target tokens
        (num_items_in_batch, times the ranks with average_tokens_across_devices), or its
        mean over the window's micro-batches for models that take no loss kwargs. DDP
        sums those over the window and averages over ranks; the engine averages over
        both, so it gets the loss times the window, and steps at its end."""
        if kwargs.get("learning_rate") is not None:
            raise _error("the LOMO optimizers step inside backward, which the engine does "
                         "not; choose another TrainingArguments.optim")
        engine = self.zeroshard_engine
        loss = _context_parallel.scaled(loss, self.args.parallelism_config)
        engine.backward(loss * engine.gradient_accumulation_steps())
        engine.step()  # steps at the accumulation boundary

    def _clip_grad_norm(self, model):
        return self.zeroshard_engine.global_grad_norm  # clipped in engine.step

    def _get_grad_norm(self, model, grad_norm=None):
        return self.zeroshard_engine.global_grad_norm

    def save_model(self, output_dir=None, _internal_call=False):
        """Hugging Face's layout (safetensors, config.json) through
        engine.save_pretrained; a collective: every rank calls it, as Trainer scripts do."""
        output_dir = output_dir or self.args.output_dir
        if self.zeroshard_engine is None:  # not trained yet: the model is whole
            return super().save_model(output_dir, _internal_call)
        self.zeroshard_engine.save_pretrained(output_dir)
        if self.args.should_save:
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            from transformers.trainer import TRAINING_ARGS_NAME
            torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _peft(self):
        """A PEFT model: its checkpoints leave the frozen base out and load non-strictly,
        as the Trainer does under DeepSpeed (the base comes from the pretrained weights)."""
        from transformers.trainer import _is_peft_model
        return _is_peft_model(self.model)

    def _save_optimizer_and_scheduler(self, output_dir):
        self.zeroshard_engine.save_checkpoint(os.path.join(output_dir, "zeroshard"),
                                              exclude_frozen_parameters=self._peft())
        if self.args.should_save and self.lr_scheduler is not None:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, _SCHEDULER_FILE))

    def _load_best_model(self):
        """load_best_model_at_end: the best checkpoint's sharded state where it has one, as
        DeepSpeed loads its own; a checkpoint of the model alone (save_only_model) is loaded
        by the Trainer's own code into the whole parameters, rank 0's kept."""
        engine = self.zeroshard_engine
        if engine is None:
            return super()._load_best_model()
        sharded = os.path.join(self.state.best_model_checkpoint, "zeroshard")
        if os.path.isdir(sharded):
            engine.load_checkpoint(sharded, load_module_strict=not self._peft())
            return
        with engine.gathered_parameters(modifier_rank=0):
            super()._load_best_model()

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return
        self.zeroshard_engine.load_checkpoint(os.path.join(checkpoint, "zeroshard"),
                                              load_module_strict=not self._peft())
        path = os.path.join(checkpoint, _SCHEDULER_FILE)
        if self.lr_scheduler is not None and os.path.isfile(path):
            self.lr_scheduler.load_state_dict(torch.load(path, weights_only=True))


_held = [None]  # a weak reference to the HfDeepSpeedConfig that TrainingArguments made


def _held_zero3_config():
    config = _held[0]() if _held[0] is not None else None
    return config.config if config is not None and config.is_zero3() else None


def _build_models_for_zeroshard():
    """From the moment a script imports ZeroShardTrainer: TrainingArguments(deepspeed=...)
    (a script's --deepspeed, parsed before it builds its model) no longer tells transformers
    to build models under DeepSpeed's zero.Init, which would hand the engine parameters
    DeepSpeed has partitioned. The config is held here instead; a model built with
    from_config while it says stage 3 is built under zeroshard.init (each rank keeps its
    shard), and from_pretrained builds on the meta device and loads each tensor, as without
    DeepSpeed. The Trainer then gives the config to the engine. This holds for the whole
    process: a script that also trains with DeepSpeed's own Trainer in it would have its
    ZeRO-3 models built for zeroshard."""
    from transformers import PreTrainedModel
    from transformers.integrations import deepspeed as hf_deepspeed
    if getattr(hf_deepspeed.set_hf_deepspeed_config, "_zeroshard", False):
        return
    import weakref

    def set_hf_deepspeed_config(config):
        _held[0] = weakref.ref(config)

    def unset_hf_deepspeed_config():
        _held[0] = None
        unset_original()

    unset_original = hf_deepspeed.unset_hf_deepspeed_config
    # TrainingArguments made before the import: its config moves here too.
    live = hf_deepspeed._hf_deepspeed_config_weak_ref
    if live is not None and live() is not None:
        _held[0] = live
        unset_original()
    set_hf_deepspeed_config._zeroshard = True
    hf_deepspeed.set_hf_deepspeed_config = set_hf_deepspeed_config
    hf_deepspeed.unset_hf_deepspeed_config = unset_hf_deepspeed_config
    from_config = PreTrainedModel._from_config.__func__

    def _from_config(cls, config, **kwargs):
        zero3 = _held_zero3_config()
        if zero3 is None:
            return from_config(cls, config, **kwargs)
        from .._engine.construction import Init
        with Init(config=zero3):
            return from_config(cls, config, **kwargs)

    PreTrainedModel._from_config = classmethod(_from_config)


def zeroshard_trainer(trainer_class):
    """trainer_class (transformers.Trainer or any subclass: Seq2SeqTrainer, TRL's
    SFTTrainer, ...) trained by the engine: a subclass taking the same arguments plus
    zeroshard_config (DeepSpeed's keys) and units.

        SFTTrainer = zeroshard_trainer(trl.SFTTrainer)
        trainer = SFTTrainer(model=model, args=sft_config, train_dataset=ds,
                             peft_config=lora, zeroshard_config="ds_config.json")"""
    import transformers
    if not (isinstance(trainer_class, type) and issubclass(trainer_class, transformers.Trainer)):
        raise _zeroshard.Error(f"zeroshard_trainer: {trainer_class!r} is not a subclass of "
                               "transformers.Trainer")
    if issubclass(trainer_class, ZeroShardTrainerMixin):
        return trainer_class
    _build_models_for_zeroshard()
    return type(f"ZeroShard{trainer_class.__name__}", (ZeroShardTrainerMixin, trainer_class),
                {"__module__": __name__, "__doc__": trainer_class.__doc__})


def __getattr__(name):
    """ZeroShardTrainer, made when first asked for (it imports transformers)."""
    if name != "ZeroShardTrainer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import transformers
    globals()[name] = zeroshard_trainer(transformers.Trainer)
    return globals()[name]
