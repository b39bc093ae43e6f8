"""zeroshard.pipe: deepspeed.pipe's names, so that a DeepSpeed pipeline script switches with
its imports: PipelineModule, LayerSpec, TiedLayerSpec and the process topologies;
zeroshard.initialize of a PipelineModule returns an engine with train_batch and eval_batch
(bindings/zeroshard/_parallel/pipe_module.py and _engine/pipe_engine.py say how)."""
from ._parallel.pipe_module import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
from ._parallel.pipe_topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                      ProcessTopology)
