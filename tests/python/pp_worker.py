"""One rank of the pipeline-parallel tests: a small GPT split into two stages (the embedding
and the first blocks; the last blocks, the final norm and the head), each stage's module
handed to zeroshard.initialize with pipeline.stages 2 and run by torch's pipelining schedule
through zeroshard.pipelining.PipelineStage on PP x DP ranks (rank // DP is the stage); or
(mode ref) the whole model in one process with torch.optim.AdamW and torch's
clip_grad_norm_, on every data-parallel rank's batch at once. Both start from the same
weights (seed 0) and write OUT.rankN.json: per-step losses (the last stage's mean over its
micro-batches), pre-clip gradient norms, and the stage's parameters at the end under the
whole model's names.
With TP > 1 the blocks are Megatron-style (tests/python/tp_worker.py) and the stages, the tp
and the dp groups come from a Megatron mpu given to initialize; each rank writes its slices.
Modes interleaved, looped and zerobubble (ScheduleInterleaved1F1B, ScheduleLoopedBFS,
ScheduleInterleavedZeroBubble) run INTERLEAVED x STAGES stages of one block each, a rank's
stages (s, s + STAGES, ...) one engine's nn.ModuleList; zbv and dualpipev
(ScheduleZBVZeroBubble, ScheduleDualPipeV) place them in a V (s, 2 x STAGES - 1 - s).
Mode traced splits the whole GPT with torch's tracer front-end (pipeline(), a SplitPoint
before the third block) and runs each rank's stage module, a GraphModule holding the whole
model's names, under Schedule1F1B.
usage: pp_worker.py MODE STEPS OUT [CONFIG_JSON [TP]]  (MODE: ref or a key of SCHEDULES)"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from tp_worker import DIM, SEQ, VOCAB, Block, devices, initialized, load_slices

LAYERS = 4
MICRO, MICROBATCHES, DP, STAGES = 2, 8, 2, 2
INTERLEAVED = 2  # stages on each rank under the multi-stage schedules (MULTI)
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 0.05


class GPT(nn.Module):
    """tp 1 and group None: unsplit; else Megatron-style blocks (tests/python/tp_worker.py)."""

    def __init__(self, tp=1, group=None):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(tp, group) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class FirstStage(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.emb = gpt.emb
        self.blocks = nn.ModuleList(gpt.blocks[:LAYERS // 2])

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return x


class LastStage(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.blocks = nn.ModuleList(gpt.blocks[LAYERS // 2:])
        self.norm, self.head = gpt.norm, gpt.head

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Part(nn.Module):
    """Stage s of INTERLEAVED x STAGES (one block each; the embedding before the first, the
    norm and the head after the last), its parameters under the whole GPT's names."""

    def __init__(self, gpt, s):
        super().__init__()
        last = STAGES * INTERLEAVED - 1
        self.emb = gpt.emb if s == 0 else None
        self.blocks = nn.ModuleDict({str(s): gpt.blocks[s]})
        self.norm, self.head = (gpt.norm, gpt.head) if s == last else (None, None)

    def forward(self, x):
        x = self.emb(x) if self.emb is not None else x
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x)) if self.head is not None else x


SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved": "ScheduleInterleaved1F1B", "looped": "ScheduleLoopedBFS",
             "zerobubble": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
             "dualpipev": "ScheduleDualPipeV", "traced": "Schedule1F1B"}
MULTI = ("interleaved", "looped", "zerobubble", "zbv", "dualpipev")  # stages on each rank


def parts_of(mode, stage_index):
    """The pipeline's stages on the ranks of stage_index: looped (s, s + STAGES, ...) or,
    for the V schedules, down the ranks and back (s, 2 x STAGES - 1 - s)."""
    if mode in ("zbv", "dualpipev"):
        return [stage_index, 2 * STAGES - 1 - stage_index]
    return list(range(stage_index, STAGES * INTERLEAVED, STAGES))


def whole_name(stage, name):
    """A stage's parameter name as the whole GPT names it (interleaved: the rank's
    ModuleList of Parts, whose names are the GPT's behind the list's index)."""
    if stage == "parts":
        return name.split(".", 1)[1]
    if stage == "traced":  # the tracer keeps the whole model's names
        return name
    if stage == 1 and name.startswith("blocks."):
        index, rest = name[len("blocks."):].split(".", 1)
        return f"blocks.{int(index) + LAYERS // 2}.{rest}"
    return name


def gpt():
    torch.manual_seed(0)
    return initialized(GPT())


def batch(step, dp_rank):
    """Rank dp_rank's batch of a step (all its micro-batches); the reference joins them."""
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    return torch.randint(0, VOCAB, (MICRO * MICROBATCHES, SEQ + 1), generator=g)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def reference(steps):
    dev = devices.device()
    model = gpt().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses, norms = [], []
    for step in range(steps):
        tokens = torch.cat([batch(step, r) for r in range(DP)]).to(dev)
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms,
            "params": {n: p.detach().tolist() for n, p in model.named_parameters()}}


class PipelineMpu:
    """Megatron's parallel_state for PP x DP x TP ranks, in Megatron's default order (tp
    fastest, pp slowest): tp groups are consecutive ranks, dp groups one rank of each tp
    group of a stage."""

    def __init__(self, tp):
        import torch.distributed as dist
        rank, world = dist.get_rank(), dist.get_world_size()
        self.tp, self.rank, self.per_stage = tp, rank, world // STAGES
        for start in range(0, world, tp):
            g = dist.new_group(list(range(start, start + tp)))
            if start <= rank < start + tp:
                self.tp_group = g
        for stage in range(STAGES):
            for t in range(tp):
                first = stage * self.per_stage + t
                g = dist.new_group(list(range(first, (stage + 1) * self.per_stage, tp)))
                if rank // self.per_stage == stage and rank % tp == t:
                    self.dp_group = g

    def get_tensor_model_parallel_world_size(self):
        return self.tp

    def get_tensor_model_parallel_rank(self):
        return self.rank % self.tp

    def get_tensor_model_parallel_group(self):
        return self.tp_group

    def get_data_parallel_world_size(self):
        return self.per_stage // self.tp

    def get_data_parallel_rank(self):
        return (self.rank % self.per_stage) // self.tp

    def get_data_parallel_group(self):
        return self.dp_group

    def get_pipeline_model_parallel_world_size(self):
        return STAGES

    def get_pipeline_model_parallel_rank(self):
        return self.rank // self.per_stage


def stage_module(stage_index, tp=1, group=None):
    whole = gpt()
    module = FirstStage(whole) if stage_index == 0 else LastStage(whole)
    if group is None:
        return module
    torch.manual_seed(0)
    split = GPT(tp, group)
    split = FirstStage(split) if stage_index == 0 else LastStage(split)
    load_slices(split, module, tp, dist_rank() % tp)
    return split


def traced_stage(stage_index):
    """The stage's module as torch's tracer front-end splits the whole GPT."""
    from torch.distributed.pipelining import SplitPoint, pipeline
    example = torch.zeros(MICRO, SEQ, dtype=torch.long)
    pipe = pipeline(gpt(), mb_args=(example,),
                    split_spec={f"blocks.{LAYERS // 2}": SplitPoint.BEGINNING})
    return pipe.get_stage_module(stage_index)


def stage_params(engine, stage_index):
    """The stage's parameters, whole, under the whole GPT's names."""
    import zeroshard
    model = engine.module
    with zeroshard.zero.GatheredParameters(list(model.parameters())):
        return {whole_name(stage_index, n): p.detach().tolist()
                for n, p in model.named_parameters()}


def count_input_halves():
    """[backwards split into input and weight halves so far] (zero-bubble schedules)."""
    from zeroshard._parallel import pipelining as _pipelining
    count, run = [0], _pipelining.PipelineStage._input_backward

    def counted(*args, **kwargs):
        count[0] += 1
        return run(*args, **kwargs)

    _pipelining.PipelineStage._input_backward = counted
    return count


def dist_rank():
    return int(os.environ["RANK"])


def trained(mode, steps, config, tp):
    import torch.distributed as dist
    from torch.distributed import pipelining

    import zeroshard
    from zeroshard.pipelining import PipelineStage

    rank = dist_rank()
    stage_index = rank // (int(os.environ["WORLD_SIZE"]) // STAGES)
    keep_gathered = config.pop("keep_gathered", True)  # the stage's, not the engine's
    reduce_once = config.pop("reduce_once", True)
    # A checkpoint saved after save_at steps, or (resume) loaded and trained on from there.
    checkpoint, save_at = config.pop("checkpoint", None), config.pop("save_at", None)
    resume = config.pop("resume", False)
    config = dict(config, train_micro_batch_size_per_gpu=MICRO,
                  gradient_accumulation_steps=MICROBATCHES, gradient_clipping=CLIP,
                  optimizer={"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS),
                                                         "eps": EPS, "weight_decay": WD}})
    dev = devices.device()
    if tp > 1:  # the stages come from the mpu
        dist.init_process_group("gloo")
        mpu = PipelineMpu(tp)
        module = stage_module(stage_index, tp, mpu.tp_group).to(dev)
        engine, _, _, _ = zeroshard.initialize(model=module, config=config, mpu=mpu)
    elif mode in MULTI:  # this rank's stages: s and s + STAGES, ..., or the V's
        torch.manual_seed(0)
        whole = initialized(GPT())
        module = nn.ModuleList(Part(whole, s) for s in parts_of(mode, stage_index)).to(dev)
        config["pipeline"] = {"stages": STAGES}
        engine, _, _, _ = zeroshard.initialize(model=module, config=config)
    else:
        module = traced_stage(stage_index) if mode == "traced" else stage_module(stage_index)
        module = module.to(dev)
        config["pipeline"] = {"stages": STAGES}
        engine, _, _, _ = zeroshard.initialize(model=module, config=config)
    dp_rank = engine.data_parallel_rank
    halves = count_input_halves()
    schedule_class = getattr(pipelining, SCHEDULES[mode])
    if mode in MULTI:
        stages = [PipelineStage(engine, stage_index=s, num_stages=STAGES * INTERLEAVED,
                                submodule=part, keep_gathered=keep_gathered,
                                reduce_once=reduce_once)
                  for s, part in zip(parts_of(mode, stage_index), module)]
        schedule = schedule_class(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        stage = PipelineStage(engine, keep_gathered=keep_gathered, reduce_once=reduce_once)
        schedule = schedule_class(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    names = "parts" if mode in MULTI else "traced" if mode == "traced" else stage_index
    losses, norms = [], []
    loaded_params = None
    if resume:
        engine.load_checkpoint(checkpoint)
        loaded_params = stage_params(engine, names)
    for step in range(save_at if resume else 0, steps):
        tokens = batch(step, dp_rank).to(dev)
        micro_losses = []
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if mode in ("zbv", "dualpipev") and stage_index == 0:  # the V's first and last stage
            schedule.step(inputs, target=targets, losses=micro_losses)
        elif mode in ("zbv", "dualpipev"):
            schedule.step()
        elif stage_index == 0:
            schedule.step(inputs)
        else:
            schedule.step(target=targets, losses=micro_losses)
        engine.step()
        norms.append(engine.get_global_grad_norm())
        if micro_losses:
            losses.append(sum(float(l) for l in micro_losses) / len(micro_losses))
        if not resume and step + 1 == save_at:
            engine.save_checkpoint(checkpoint)
            saved_params = stage_params(engine, names)
    sent = engine._engine.bytes_sent()  # before the gather below
    model = engine.module
    params = stage_params(engine, names)
    split = {whole_name(names, n): p.partition_dim for n, p in model.named_parameters()
             if getattr(p, "tensor_model_parallel", False)}
    dist.barrier()
    kinds = engine.memory_report()["device"]["kinds"]
    memory = {k: [kinds[k]["peak"], kinds[k]["predicted"]]
              for k in ("params", "gathered_params", "grads")}
    return {"losses": losses, "norms": norms, "params": params, "split": split,
            "params_at_save": saved_params if save_at and not resume else None,
            "params_at_load": loaded_params,
            "stage": stage_index, "bytes_sent": sent, "memory": memory,
            "input_halves": halves[0],
            "skipped_steps": engine.skipped_steps, "loss_scale": engine.loss_scale,
            "dp_world_size": engine.dp_world_size, "mp_world_size": engine.mp_world_size,
            "train_batch_size": engine.train_batch_size()}


def main():
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    if mode == "ref":
        result = reference(steps)
    else:
        tp = int(sys.argv[5]) if len(sys.argv) > 5 else 1
        result = trained(mode, steps, json.loads(sys.argv[4]), tp)
    with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
