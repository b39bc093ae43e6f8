"""deepspeed.runtime.pipe.topology: the process topologies a PipelineModule takes."""
from ..._parallel.pipe_topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                        ProcessTopology)
