"""zeroshard.pipelining: torch.distributed.pipelining's schedules over zeroshard engines, one
engine per pipeline stage with ZeRO inside the stage's ranks (bindings/zeroshard/_parallel/pipelining.py
says how). Pipeline stages are the outermost dimension: with `pipeline.stages: P` in the
config, ranks [s * W/P, (s + 1) * W/P) build stage s."""
from ._parallel.pipelining import PipelineStage, pipeline_group  # noqa: F401
