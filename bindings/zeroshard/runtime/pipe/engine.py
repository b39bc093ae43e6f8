"""deepspeed.runtime.pipe.engine: PipelineEngine, what zeroshard.initialize returns for a
PipelineModule."""
from ..._engine.pipe_engine import PipelineEngine  # noqa: F401
