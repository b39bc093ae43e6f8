"""deepspeed.runtime.pipe.topology: the process topologies a PipelineModule takes."""
from ..._pipe_topology import (PipeDataParallelTopology,  # noqa: F401
                               PipeModelDataParallelTopology, ProcessTopology)
