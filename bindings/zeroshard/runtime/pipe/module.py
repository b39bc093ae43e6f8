"""deepspeed.runtime.pipe.module: PipelineModule and its layer specs."""
from ..._parallel.pipe_module import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
