"""DeepSpeed's PipelineEngine surface over a zeroshard engine (zeroshard.initialize of a
zeroshard.pipe.PipelineModule): engine.train_batch(data_iter) runs one step of
gradient_accumulation_steps micro-batches through torch's Schedule1F1B over this rank's
stage (zeroshard.pipelining.PipelineStage) and steps; eval_batch runs them forward only.
ZeRO 1, 2 and 3 inside each stage (DeepSpeed's pipeline engine allows 0 and 1).

As DeepSpeed's engine: the first and the last stage each read every micro-batch from
data_iter ((inputs, labels): the first takes inputs, the last labels), the returned loss
is the mean over the micro-batches and the data-parallel ranks, on every rank.

Tied layers (TiedLayerSpec): DeepSpeed keeps a copy on each stage that uses the key, sums the
copies' gradients over them before the step and steps each alike. Here the lowest such stage
owns the parameter (its engine holds, shards and steps it, and counts it once in the
gradient norm); the other stages hold a plain tensor copy whose gradient, summed over the
step's micro-batches, they send to the owner after their last backward, and the owner adds
it to its own in its last backward (before the engine reduces it over the data-parallel
ranks). After each step the owner sends the updated values to the copies."""
import torch
import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from .._common import config as _config, launch as _launch, process_groups
from .._common import refusals as _refusals
from .. import _zeroshard
from .engine import ZeroShardEngine
from .._parallel.pipe_module import non_reentrant_checkpoint
from .._parallel.pipelining import PipelineStage, pipeline_group
from .dataloader import RepeatingLoader, deferred_draws, draw_as_a_dataloader_does


def _error(message):
    return _zeroshard.Error(f"zeroshard.pipe: {message}")


def pipe_config(config, module):
    """`config` with pipeline.stages set to the module's num_stages (a contradiction refused)."""
    config, origin = _config.as_mapping(config, check=False)  # the engine parses it
    if not isinstance(config.get("pipeline") or {}, dict):
        return config  # the engine's parse names it
    pipeline = dict(config.get("pipeline") or {})
    stages = pipeline.get("stages", "auto")
    if stages not in ("auto", None, module.num_stages):
        raise _error(f"{origin}: pipeline.stages is {stages} but the PipelineModule has "
                     f"num_stages={module.num_stages}; allowed: the same, auto, or leave it out")
    pipeline["stages"] = module.num_stages
    # DeepSpeed's engine hands these two to the module: a config interval over 0 replaces
    # the module's, use_reentrant false (true by default) its checkpoint function.
    interval = pipeline.pop("activation_checkpoint_interval", 0)
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
        raise _error(f"{origin}: pipeline.activation_checkpoint_interval is {interval!r}; "
                     "allowed: 0 (the module's own) or a number of layers")
    if interval:
        module.activation_checkpoint_interval = interval
    reentrant = pipeline.pop("use_reentrant", True)
    reentrant = True if reentrant is None else reentrant  # DeepSpeed's default
    if reentrant not in (True, False):
        raise _error(f"{origin}: pipeline.use_reentrant is {reentrant!r}; allowed: true, false")
    if not reentrant:
        module.activation_checkpoint_func = non_reentrant_checkpoint
    return dict(config, pipeline=pipeline)


class _Ties:
    """This rank's tied parameters: owned (stepped here) or copies (plain tensors)."""

    def __init__(self, module):
        world, rank = dist.get_world_size(), dist.get_rank()
        per_stage = world // module.num_stages
        self.owned, self.copies = [], []  # (tensor, group, the group's ranks: owner first)
        self.replaced = set()  # ids of the parameters the copies replaced
        self._sending = []
        self._homes = {}  # id(copy) -> [(module, attribute)]
        for key in module.tied_keys():  # every rank makes every group, in one order
            stages = module.tied_stages(key)
            for place in range(per_stage):
                ranks = [s * per_stage + place for s in stages]
                group = process_groups.new_group(ranks) if len(ranks) > 1 else None
                if rank not in ranks or group is None:
                    continue
                tied = module.tied_modules[key]
                for attr in module.tied_weight_attrs[key]:
                    value = getattr(tied, attr)
                    if module.stage_id == stages[0]:
                        self.owned.append((value, group, ranks))
                        dist.broadcast(value.data, ranks[0], group=group)
                    else:  # a plain tensor: the engine never sees it
                        copy = value.detach().clone().requires_grad_(value.requires_grad)
                        self.replaced.add(id(tied._parameters.pop(attr)))
                        setattr(tied, attr, copy)
                        self._homes[id(copy)] = [(tied, attr)]
                        dist.broadcast(copy.data, ranks[0], group=group)
                        self.copies.append((copy, group, ranks))

    def in_dtype(self, dtype):
        """The copies in the engine's compute dtype, as the owner's parameter now is."""
        for i, (copy, group, ranks) in enumerate(self.copies):
            if copy.dtype != dtype:
                cast = copy.detach().to(dtype).requires_grad_(copy.requires_grad)
                for module_attr in self._homes[id(copy)]:
                    setattr(*module_attr, cast)
                self.copies[i] = (cast, group, ranks)

    def drop_from(self, optimizer):
        """A client optimizer built over model.parameters() no longer holds the copies."""
        for group in getattr(optimizer, "param_groups", []):
            group["params"] = [p for p in group["params"] if id(p) not in self.replaced]

    def without_copies(self, model_parameters):
        """The script's parameter list (DeepSpeed scripts pass model.parameters()) without
        the parameters a copy replaced."""
        if model_parameters is None:
            return None
        kept = []
        for item in model_parameters:
            if isinstance(item, dict):
                kept.append(dict(item, params=[p for p in item["params"]
                                               if id(p) not in self.replaced]))
            elif id(item) not in self.replaced:
                kept.append(item)
        return kept

    def send_gradients(self):
        """A copy's gradient of the step's micro-batches, on its way to the owner (which
        waits for it before its own last backward, behind this stage's last gradients)."""
        for copy, group, ranks in self.copies:
            grad = copy.grad if copy.grad is not None else torch.zeros_like(copy)
            self._sending.append((dist.reduce(grad.contiguous(), ranks[0], group=group,
                                              async_op=True), grad))
            copy.grad = None

    def sent(self):
        for work, _ in self._sending:
            work.wait()
        self._sending = []

    def receive_gradients(self):
        """[(owned parameter, the copies' gradients summed)], for the backward that follows."""
        received = []
        for value, group, ranks in self.owned:
            total = torch.zeros(value.shape, dtype=value.dtype, device=value.device)
            dist.reduce(total, ranks[0], group=group)
            received.append((value, total))
        return received

    def send_values(self, engine):
        """After a step: the owner's updated values to every copy."""
        for value, group, ranks in self.owned:
            with engine.gathered([value]):
                dist.broadcast(value.data, ranks[0], group=group)
        for copy, group, ranks in self.copies:
            with torch.no_grad():
                dist.broadcast(copy.data, ranks[0], group=group)


class _TiedStage(PipelineStage):
    def __init__(self, engine, ties):
        super().__init__(engine)
        self._ties = ties
        self.draws_before = []  # per micro-batch: the loader's draws owed before its forward

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        owed = self.draws_before[fwd_chunk_id] if fwd_chunk_id < len(self.draws_before) else 0
        for _ in range(owed):
            draw_as_a_dataloader_does()
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
        received = self._ties.receive_gradients() if last_backward else []
        if received:
            # Each owned parameter is one more root of this backward, its gradient the copies'
            # sum: autograd adds it to what the stage's own use gives, before the engine's
            # hooks see the parameter's gradient.
            bwd_kwargs = dict(bwd_kwargs, stage_output=tuple(bwd_kwargs["stage_output"])
                              + tuple(v for v, _ in received),
                              output_grads=tuple(bwd_kwargs["output_grads"])
                              + tuple(g for _, g in received))
        result = super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        if last_backward:
            self._ties.send_gradients()
        return result


class PipelineEngine(ZeroShardEngine):
    """The engine of one pipeline stage, with DeepSpeed's PipelineEngine calls."""
    _INSTRUCTION_MAP = _refusals.Refused("runtime.pipe.engine.PipelineEngine._INSTRUCTION_MAP")

    def __init__(self, model, config, **kwargs):
        _launch.init_distributed()
        ties = _Ties(model)  # before the engine: copies are no parameters of it
        kwargs["model_parameters"] = ties.without_copies(kwargs.get("model_parameters"))
        ties.drop_from(kwargs.get("optimizer"))
        super().__init__(model, pipe_config(config, model), **kwargs)
        compute = (torch.bfloat16 if self.bfloat16_enabled()
                   else torch.float16 if self.fp16_enabled() else None)
        if compute is not None:
            ties.in_dtype(compute)
        self.data_iterator = None  # what train_batch() reads without a data_iter
        self.stage_id, self.num_stages = model.stage_id, model.num_stages
        self._ties = ties
        self._dp_group = self._stage_group()
        self._pp_group = pipeline_group(self)
        self._stage = _TiedStage(self, ties)
        # torch's 1F1B needs a micro-batch for each stage; with fewer (DeepSpeed's default
        # gradient_accumulation_steps is 1) GPipe runs them, the same order then.
        micro = self.gradient_accumulation_steps()
        schedule = Schedule1F1B if micro >= self.num_stages else ScheduleGPipe
        self._schedule = schedule(self._stage, n_microbatches=micro, loss_fn=model.loss_fn)

    def load_checkpoint(self, *args, **kwargs):
        """A tied copy is no parameter of its stage's engine: the owner's loaded value to it."""
        loaded = super().load_checkpoint(*args, **kwargs)
        self._ties.send_values(self)
        return loaded

    def _stage_group(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        per_stage = world // self.num_stages
        mine = None
        for stage in range(self.num_stages):
            ranks = list(range(stage * per_stage, (stage + 1) * per_stage))
            group = process_groups.new_group(ranks)
            if rank in ranks:
                mine = group
        return mine

    def is_first_stage(self):
        return self.stage_id == 0

    def is_last_stage(self):
        return self.stage_id == self.num_stages - 1

    def build_data_iter(self, dataset):
        """DeepSpeed's pipeline engine: the first and the last stage read `dataset` (given
        to initialize as training_data) in order, each data-parallel rank its share,
        repeating."""
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=self.dp_world_size, rank=self.data_parallel_rank,
            shuffle=False)
        self.set_dataloader(RepeatingLoader(self.deepspeed_io(dataset, data_sampler=sampler)))

    def set_dataloader(self, loader):
        """The loader train_batch() reads when it gets no data_iter (first and last stage)."""
        if self.is_first_stage() or self.is_last_stage():
            self.training_dataloader = loader
            self.data_iterator = iter(loader)

    def set_dataiterator(self, iterator):
        """The iterator train_batch() reads when it gets no data_iter (first and last stage)."""
        if self.is_first_stage() or self.is_last_stage():
            self.training_dataloader = None
            self.data_iterator = iterator

    def _read(self, data_iter):
        """The step's micro-batches: inputs on the first stage, labels on the last. A pass of
        the engine's own loader that begins at micro-batch k draws from the global generator
        before k's forward, where DeepSpeed's stage reads it (runtime/dataloader.py)."""
        micro = self.gradient_accumulation_steps()
        self._stage.draws_before = [0] * micro
        if not (self.is_first_stage() or self.is_last_stage()):
            return None, None
        if data_iter is None:
            raise _error("train_batch(data_iter): data_iter is required on the first and the "
                         "last stage (or training_data given to initialize)")
        batches = []
        for k in range(micro):
            with deferred_draws() as begun:
                batches.append(next(data_iter))
            self._stage.draws_before[k] = len(begun)
        inputs = torch.cat([b[0] for b in batches]) if self.is_first_stage() else None
        labels = torch.cat([b[1] for b in batches]) if self.is_last_stage() else None
        return inputs, labels

    def _run(self, run, data_iter):
        inputs, labels = self._read(data_iter)
        losses = []
        if self.is_first_stage():
            run(inputs.to(self.device))
        elif self.is_last_stage():
            run(target=labels.to(self.device), losses=losses)
        else:
            run()
        return self._mean_loss(losses)

    def _mean_loss(self, losses):
        """The last stage's mean over micro-batches and data-parallel ranks, on every rank."""
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if losses:
            loss = torch.stack([l.detach().float() for l in losses]).mean().to(self.device)
            dist.all_reduce(loss, group=self._dp_group)
            loss /= dist.get_world_size(self._dp_group)
        last = dist.get_global_rank(self._pp_group, self.num_stages - 1)
        dist.broadcast(loss, last, group=self._pp_group)
        return loss

    def train_batch(self, data_iter=None):
        """One optimizer step over gradient_accumulation_steps micro-batches; the mean loss."""
        if self.module.loss_fn is None:
            raise _error("train_batch: the PipelineModule has no loss_fn; allowed: "
                         "PipelineModule(..., loss_fn=...)")
        if not torch.is_grad_enabled():
            raise _error("train_batch() needs gradients enabled (it ran under torch.no_grad "
                         "or inference_mode); allowed: eval_batch() for forward only")
        if data_iter is not None:  # as DeepSpeed's: later steps read it too
            self.set_dataiterator(data_iter)
        self.module.train()  # as DeepSpeed's: eval_batch left it in eval mode
        loss = self._run(self._schedule.step, self.data_iterator)
        self._ties.sent()
        self.step()
        self._ties.send_values(self)
        return loss

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output="avg",
                   bcast_loss=True, num_micro_batches=None):
        """The mean loss of gradient_accumulation_steps micro-batches, forward only, in eval
        mode, on every rank."""
        if (return_logits or not compute_loss or reduce_output != "avg" or not bcast_loss
                or num_micro_batches):
            raise _error("eval_batch: return_logits, compute_loss=False, reduce_output other "
                         "than 'avg', bcast_loss=False and num_micro_batches are not supported "
                         "yet; allowed: the defaults")
        if not hasattr(self._schedule, "eval"):
            raise _error(f"eval_batch: torch {torch.__version__}'s pipelining schedules have no "
                         "forward-only eval(); allowed: torch 2.7 or newer")
        self.module.eval()  # dropout off, as DeepSpeed's eval_batch (train_batch turns it on)
        with torch.no_grad():
            return self._run(self._schedule.eval, data_iter)
