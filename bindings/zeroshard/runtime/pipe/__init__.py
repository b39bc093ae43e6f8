"""zeroshard.runtime.pipe: deepspeed.runtime.pipe's names: the module, its layer specs, the
topologies and the pipeline engine. DeepSpeed's instruction schedules are refused by name:
zeroshard's pipeline engine runs torch.distributed.pipelining's."""
from ..._common import refusals as _refusals
from ...pipe import (LayerSpec, PipeDataParallelTopology, PipeModelDataParallelTopology,
                     PipelineModule, ProcessTopology, TiedLayerSpec)
from . import engine, module, topology  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
