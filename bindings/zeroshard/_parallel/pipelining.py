"""torch.distributed.pipelining over zeroshard engines (zeroshard.pipelining).

Each rank builds its stage's module and gives it to zeroshard.initialize with the config's
`pipeline.stages`; the engine shards it over the ranks of its own stage (pp is the
outermost dimension: engine/ParallelDims.h). `PipelineStage(engine)` is torch's
PipelineStage over that engine, for torch's schedules (ScheduleGPipe, Schedule1F1B):

    stage = zeroshard.pipelining.PipelineStage(engine)
    schedule = ScheduleGPipe(stage, n_microbatches=8, loss_fn=loss_fn)
    schedule.step(x, target=y, losses=losses)   # first stage: x; last: target
    engine.step()

Interleaved schedules (ScheduleInterleaved1F1B, ScheduleLoopedBFS) run V stages on each
rank: stage s on the ranks of stage s % P, as torch places them. The rank's stages are the
parts of one engine's module (an nn.ModuleList), one PipelineStage each:

    parts = nn.ModuleList(build(s) for s in range(mine, P * V, P))
    engine, *_ = zeroshard.initialize(model=parts, config=config)   # pipeline.stages: P
    stages = [PipelineStage(engine, stage_index=s, num_stages=P * V, submodule=part)
              for s, part in zip(range(mine, P * V, P), parts)]
    ScheduleInterleaved1F1B(stages, n_microbatches=8, loss_fn=loss_fn).step(...)

The engine counts a micro-batch at the last of its stages' backwards, so the window ends
with the step's last backward on the rank, and one optimizer step, one norm and one
reduction (reduce_once) cover all of them. Zero-bubble schedules (ScheduleInterleavedZeroBubble;
ScheduleZBVZeroBubble and ScheduleDualPipeV, whose V puts stages s and 2P-1-s on one rank)
split each backward in an input and a weight half; the engine counts the weight half
(PipelineStage.backward_maybe_with_nosync).

What the stage does that torch's does for DDP and FSDP modules:
- each micro-batch's backward runs inside the engine's backward (its gradients reduced as
  in any accumulation window; fp16's loss scale applied on the last stage, and the
  overflow check and the clipping norm summed across the stages);
- the gradients are not divided by the number of micro-batches afterwards: the engine's
  step averages over gradient_accumulation_steps micro-batches, which must be the
  schedule's n_microbatches (checked before the first micro-batch);
- runtime shape inference runs the stage's module once on zeros of the received shapes
  (torch's runs it on meta tensors, which a module holding real weights refuses);
- at stage 3 a unit stays gathered across a step's micro-batches (keep_gathered)."""
import os

import torch
import torch.distributed as dist
from torch.autograd.graph import GradientEdge
from torch.distributed.pipelining import PipelineStage as _TorchPipelineStage

from .._common import launch as _launch, process_groups
from .. import _zeroshard

_pp_groups = {}  # (world, stages) -> this rank's pp process group
_launch.forget_at_exit(_pp_groups.clear)


class _EveryWork:
    """The Works of one batch of sends and receives, waited as one."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for work in self.works:
            work.wait()
        return True


def _wait_every_op_of_a_batch():
    """torch 2.6's schedules keep one Work of each batch of sends and receives (its
    schedules._batch_p2p returns the last of batch_isend_irecv's list; later torches return
    the list). Over Gloo each op is a Work of its own, and a send dropped unwaited does not
    arrive: Schedule1F1B, which batches a send with a receive, and the interleaved schedules
    hang there, with or without zeroshard (measured). There, the batch's every Work is
    waited."""
    from torch.distributed.pipelining import schedules
    if schedules._batch_p2p is _batch_every_op or schedules._batch_p2p([]) is not None:
        return  # replaced already, or a list: every Work is the caller's
    schedules._batch_p2p = _batch_every_op


def _batch_every_op(p2p_ops, desc=None):
    return _EveryWork(dist.batch_isend_irecv(p2p_ops)) if p2p_ops else None


def _error(message):
    return _zeroshard.Error(f"zeroshard.pipelining: {message}")


def _through_host(op, received):
    """The op on a host tensor: Gloo's sends and receives take a tensor's data pointer as host
    memory, so a GPU stage's over Gloo (ranks sharing one GPU) go through a host copy; a
    received one lands in `received` {id(device buffer): (device buffer, host copy)}, copied
    into the device buffer when the stage reads it (after the schedule's wait)."""
    if op.op is dist.isend:
        host = op.tensor.detach().to("cpu")
    else:
        buffer = op.tensor
        host = torch.empty(buffer.shape, dtype=buffer.dtype)
        received[id(buffer)] = (buffer, host)
    return dist.P2POp(op.op, host, op.peer, op.group, op.tag)


def pipeline_group(engine):
    """This rank's pp group: one rank of each stage, those with this rank's place in theirs,
    in stage order (torch.distributed's, for the stages' sends and receives). Every rank
    makes every pp group, in one order, as torch.distributed.new_group asks."""
    core = engine._engine
    stages = core.pipeline_parallel_size
    _launch.init_distributed()
    world = dist.get_world_size()
    key = (world, stages)
    if key not in _pp_groups:
        per_stage = world // stages
        mine = None
        for place in range(per_stage):
            ranks = [stage * per_stage + place for stage in range(stages)]
            group = process_groups.new_group(ranks)
            if dist.get_rank() in ranks:
                mine = group
        _pp_groups[key] = mine
    return _pp_groups[key]


def _stages_on_rank(engine, num_stages, submodule):
    """How many of the pipeline's stages this rank runs (num_stages over the ranks' stages),
    checked against what another stage of the engine said."""
    ranks = engine._engine.pipeline_parallel_size
    if num_stages < ranks or num_stages % ranks:
        raise _error(f"num_stages={num_stages} over the engine's pipeline.stages {ranks}; "
                     f"allowed: {ranks} (one stage per rank) or a multiple of it (as many on "
                     "each rank, for interleaved schedules)")
    on_rank = num_stages // ranks
    if on_rank > 1 and (submodule is None or not any(m is submodule
                                                     for m in engine.module.modules())):
        raise _error(f"num_stages={num_stages}: {on_rank} stages on each rank, each a part of "
                     "the engine's module; allowed: submodule= that part (the module given "
                     "to initialize holds them all, an nn.ModuleList of the rank's stages)")
    if on_rank == 1 and submodule is not None and submodule is not engine.module:
        raise _error("submodule: one stage per rank runs the engine's whole module; allowed: "
                     "None, or num_stages a multiple of pipeline.stages")
    told = engine.__dict__.get("_pipeline_stages_on_rank")
    if told is not None and told != on_rank:
        raise _error(f"num_stages={num_stages} ({on_rank} on each rank) but another "
                     f"PipelineStage of this engine said {told} on each rank; allowed: one "
                     "num_stages for every stage")
    return on_rank


def _placements(ranks, num_stages, mine):
    """The stages the rank of pipeline stage `mine` may run: looped (s % ranks, torch's
    interleaved schedules) and V-shaped (down the ranks and back up, its V schedules)."""
    looped = list(range(mine, num_stages, ranks))
    if num_stages != 2 * ranks:  # the V schedules run two stages on each rank
        return looped, looped
    v_shaped = [mine, num_stages - 1 - mine]
    return looped, v_shaped


def _listed(stages):
    return ", ".join(str(s) for s in stages)


def _tell_stages_on_rank(engine, on_rank):
    """Once the stage is built: the engine counts a micro-batch at the last of as many
    backwards."""
    if engine.__dict__.get("_pipeline_stages_on_rank") is None:
        engine._engine.set_pipeline_stages_on_rank(on_rank)
        engine._pipeline_stages_on_rank = on_rank


class _RealShapes(torch.nn.Module):
    """The stage's module, given zeros where shape inference hands it meta tensors."""

    def __init__(self, module, device):
        super().__init__()
        self.module = module
        self._device = device

    def forward(self, *args, **kwargs):
        def real(t):
            if isinstance(t, torch.Tensor) and t.is_meta:
                return torch.zeros(t.shape, dtype=t.dtype, device=self._device)
            return t

        args = torch.utils._pytree.tree_map(real, args)
        kwargs = torch.utils._pytree.tree_map(real, kwargs)
        return self.module(*args, **kwargs)


class PipelineStage(_TorchPipelineStage):
    """torch.distributed.pipelining.PipelineStage over a zeroshard engine: `engine` is what
    zeroshard.initialize returned for this rank's stage. stage_index and num_stages default
    to the engine's (its pp coordinate and pipeline.stages), group to its pp group, device
    to its parameters'. input_args/output_args as torch's (shapes given up front).
    num_stages a multiple of pipeline.stages: several stages on each rank, each `submodule`
    (a part of the engine's module) with its stage_index (module docstring).
    reduce_once=False there reduces every part's gradients in each backward (the parts
    idle in it add zeros: twice the traffic with two parts).
    keep_gathered (stage 3): each unit stays gathered from its first use in a step to the
    optimizer step, across the micro-batches (FSDP's reshard_after_forward=False; the plan
    counts the stage's whole parameters as gathered); False gathers it again for each
    micro-batch's forward and backward, for a stage whose parameters do not fit whole.
    reduce_once (stages 2-3): the gradients are reduced once, after the step's last
    micro-batch, each group's whole gradient buffer accumulating the micro-batches until then
    (as torch's schedules reduce an FSDP module; planned as held whole); False reduces each
    micro-batch's into the shards, for a stage whose gradients do not fit whole."""

    def __init__(self, engine, stage_index=None, num_stages=None, device=None, input_args=None,
                 output_args=None, group=None, dw_builder=None, keep_gathered=True,
                 reduce_once=True, submodule=None):
        core = engine._engine
        ranks = core.pipeline_parallel_size  # stages of ranks; each holds num_stages / ranks
        if ranks < 2:
            raise _error(f"the engine was built with pipeline.stages {ranks}; allowed: the "
                         "number of stages (2 or more), set in the config given to initialize")
        num_stages = ranks if num_stages is None else num_stages
        on_rank = _stages_on_rank(engine, num_stages, submodule)
        mine = core.pipeline_stage
        if stage_index is None and on_rank == 1:
            stage_index = mine
        looped, v_shaped = _placements(ranks, num_stages, mine)
        if stage_index not in looped + v_shaped:
            raise _error(f"stage_index={stage_index} on a rank of pipeline stage {mine} (rank // "
                         f"(world / pipeline.stages)); allowed: {_listed(looped)} (stage s "
                         f"runs on the ranks of stage s % {ranks}, as torch's interleaved "
                         "schedules place it)"
                         + (f" or {_listed(v_shaped)} (the V of ScheduleZBVZeroBubble and "
                            "ScheduleDualPipeV)" if v_shaped != looped else "")
                         + (", or leave it out" if on_rank == 1 else ""))
        if dw_builder is not None:
            raise _error("dw_builder: a weight backward of one's own is not supported (the "
                         "stage runs the weight half of split backward itself, through the "
                         "engine); allowed: None")
        module = engine.module if submodule is None else submodule
        if not any(p.requires_grad for p in module.parameters()):
            raise _error(f"stage {stage_index} has no trainable parameter; allowed: a "
                         "stage with at least one (the gradient norm and the overflow check "
                         "are summed across the stages, each taking part)")
        device = torch.device(device) if device is not None else engine.device
        super().__init__(_RealShapes(module, device), stage_index, num_stages, device,
                         input_args=input_args, output_args=output_args,
                         group=group if group is not None else pipeline_group(engine))
        _wait_every_op_of_a_batch()
        self.engine = engine
        self._on_rank = on_rank
        _tell_stages_on_rank(engine, on_rank)
        built = engine.__dict__.setdefault("_pipeline_stages_built", set())
        built.add(stage_index)
        if keep_gathered:
            core.keep_units_gathered_in_step()
        if reduce_once:
            core.reduce_once_per_step()
        # Over Gloo a GPU stage's sends and receives go through the host (_through_host);
        # ZS_PIPELINE_VIA_HOST=1 makes a CPU stage's go the same way (its test on the CPU).
        self._via_host = dist.get_backend(self.group) == dist.Backend.GLOO and (
            self.device.type == "cuda" or os.environ.get("ZS_PIPELINE_VIA_HOST") == "1")
        self._received = {}
        self._backwards = 0  # this schedule step's micro-batches so far
        # [micro-batches whose activations the rank's stages hold, the most this step]
        self._in_flight = engine.__dict__.setdefault("_pipeline_in_flight", [0, 0])

    def forward_one_chunk(self, *args, **kwargs):
        """Counts the micro-batches whose activations the rank holds, for the plan."""
        out = super().forward_one_chunk(*args, **kwargs)
        if self.has_backward:
            held = self._in_flight
            if held[0] == 0:  # a step begins
                held[1] = 0
            held[0] += 1
            held[1] = max(held[1], held[0])
        return out

    def _shape_inference(self, *args, **kwargs):
        """Shape inference is no micro-batch: it leaves the random streams (dropout's) and
        DeepSpeed's PipelineModule's count of forwards (seed_layers) as they were."""
        module = self.engine.module
        counted = getattr(module, "micro_offset", None)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            out = super()._shape_inference(*args, **kwargs)
        if counted is not None:
            module.micro_offset = counted
        return out

    def _get_init_p2p_neighbors_ops(self):
        """The first exchange with the neighbouring stages, less those on this rank (a V
        schedule's turn): Gloo has no pair to itself, and the schedule hands such a stage
        its input locally."""
        mine = dist.get_rank(self.group)
        return self._placed([op for op in super()._get_init_p2p_neighbors_ops()
                             if dist.get_global_rank(self.group, mine) != op.peer], {})

    def _placed(self, ops, received):
        return [_through_host(op, received) for op in ops] if self._via_host else ops

    def _get_recv_ops(self, recv_infos):
        return self._placed(super()._get_recv_ops(recv_infos), self._received)

    def get_fwd_send_ops(self, fwd_chunk_id):
        return self._placed(super().get_fwd_send_ops(fwd_chunk_id), {})

    def get_bwd_send_ops(self, bwd_chunk_id):
        return self._placed(super().get_bwd_send_ops(bwd_chunk_id), {})

    def _retrieve_recv_activations(self, fwd_chunk_id):
        self._land(self.args_recv_info[fwd_chunk_id])
        return super()._retrieve_recv_activations(fwd_chunk_id)

    def _retrieve_recv_grads(self, bwd_chunk_id):
        self._land(self.grad_recv_info[bwd_chunk_id])
        return super()._retrieve_recv_grads(bwd_chunk_id)

    def _land(self, recv_infos):
        """What arrived in host copies, into the device buffers the stage reads."""
        for info in recv_infos:
            buffer = getattr(info, "buffer", None)
            arrived = self._received.pop(id(buffer), None) if buffer is not None else None
            if arrived is not None:
                with torch.no_grad():
                    buffer.copy_(arrived[1])

    def _prepare_forward_infra(self, num_microbatches, *args, **kwargs):
        built = sorted(self.engine._pipeline_stages_built)
        if len(built) != self._on_rank:
            raise _error(f"this rank holds {self._on_rank} of the {self.num_stages} stages but "
                         f"built PipelineStages {built}; allowed: one PipelineStage for each "
                         "part of the engine's module, all given to the schedule")
        placed = getattr(self, "stage_index_to_group_rank", None)
        if placed:  # the schedule's placement: the stages it sends this rank's to
            mine = sorted(s for s, r in placed.items() if r == self.group_rank)
            if mine != built:
                raise _error(f"the schedule runs stages {mine} on this rank but its "
                             f"PipelineStages are {built}; allowed: the stages the schedule "
                             "places here (looped: s % pipeline.stages; V schedules: down "
                             "the ranks and back)")
        micro = self.engine.gradient_accumulation_steps()
        if num_microbatches != micro:
            raise _error(
                f"the schedule's n_microbatches is {num_microbatches} but the config's "
                f"gradient_accumulation_steps is {micro}; allowed: equal (the engine steps "
                "after that many micro-batches' backward and averages over them)")
        return super()._prepare_forward_infra(num_microbatches, *args, **kwargs)

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
        """Each micro-batch's backward inside the engine's. Zero-bubble schedules split it:
        the input half ("input": the stage's inputs' gradients, for the stage before) and,
        later, the weight half ("weight": the parameters', from what the input half left at
        the nodes where the inputs' and the parameters' paths meet); the engine counts and
        reduces at the weight half (engine/EngineImpl.h begin_input_backward)."""
        core = self.engine._engine
        if backward_type == "input":
            return self._input_backward(core, bwd_kwargs, last_backward)
        if backward_type == "weight":
            core.begin_weight_backward()
            self._weight_backward(bwd_kwargs["param_groups"])
            core.end_weight_backward()
            self._backward_done()
            return (), None
        if self.is_last:  # the loss: fp16's scale goes in here
            bwd_kwargs = dict(bwd_kwargs, stage_output=core.begin_backward(
                bwd_kwargs["stage_output"]))
        else:
            core.begin_backward(torch.zeros((), device=self.device))
        result = super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        core.end_backward()
        self._backward_done()
        return result

    def _backward_done(self):
        self.engine._pending_backward = True
        self._backwards += 1
        self._in_flight[0] = max(self._in_flight[0] - 1, 0)

    def _input_backward(self, core, bwd_kwargs, last_backward):
        if self.is_last:  # (loss,): fp16's scale goes in here
            loss, = bwd_kwargs["stage_output"]
            bwd_kwargs = dict(bwd_kwargs, stage_output=(core.begin_input_backward(loss),))
        else:
            core.begin_input_backward(torch.zeros((), device=self.device))
        result = super().backward_maybe_with_nosync("input", bwd_kwargs, last_backward)
        core.end_input_backward()
        if self.is_last:  # torch detaches the scaled copy it was given; the loss too, so
            loss.detach_()  # what only the input half needed goes now (as torch's own does)
        return result

    def _weight_backward(self, param_groups):
        """The parameters' gradients of one micro-batch, accumulated into .grad by autograd
        itself, through each parameter's accumulator node (torch's weight half sets .grad
        by hand, which the engine's hooks on each parameter's accumulation would not see)."""
        for group in param_groups or ():
            edges, grads = [], []
            for received, node in zip(group.get("grads") or (), group["intermediates"]):
                got = [g for g in received if g is not None]
                if got:
                    edges.append(GradientEdge(node, 0))
                    grads.append(sum(got))
            del group["intermediates"]  # its hooks hold the group: torch's cycle, broken
            group.pop("grads", None)
            if edges:
                torch.autograd.backward(edges, grad_tensors=grads, inputs=[
                    GradientEdge(accumulator, 0) for accumulator in group["params"]])

    def scale_grads(self, grad_scale_factor):
        """torch divides each parameter's .grad here; the engine's step averages instead,
        over the same micro-batches (checked)."""
        micro = self.engine.gradient_accumulation_steps()
        backwards, self._backwards = self._backwards, 0
        if not self.has_backward:  # schedule.eval(): forward only, no gradients
            return
        if self._on_rank == 1:  # the plan counts the stage's blocks that many times
            self.engine._engine.set_pipeline_in_flight(self._in_flight[1], micro)
        if backwards != micro:
            raise _error(f"{backwards} micro-batches' backward ran in this schedule step, but "
                         f"gradient_accumulation_steps is {micro}; allowed: equal")
        if grad_scale_factor != micro:
            raise _error(
                f"the schedule scales gradients by 1/{grad_scale_factor}, the engine averages "
                f"over gradient_accumulation_steps {micro} micro-batches: a schedule built "
                "with scale_grads=False sums them; allowed: scale_grads=True (the default) "
                "with a loss_fn that averages over its micro-batch")

    def perform_reduce_grad(self, grad_scale_factor):
        self.scale_grads(grad_scale_factor)
