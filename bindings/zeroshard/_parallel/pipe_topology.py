"""DeepSpeed's process topologies (zeroshard.pipe.ProcessTopology, PipeDataParallelTopology,
PipeModelDataParallelTopology): named axes laid out row-major over the ranks, the last axis
varying fastest. A PipelineModule given one takes its number of stages from the 'pipe' axis;
the layouts zeroshard runs are those whose stages are the outermost axis and whose data
parallel ranks fill the rest (engine/ParallelDims.h), checked by `pipe_and_data`."""
import itertools
from collections import namedtuple

from .. import _zeroshard


def _error(message):
    return _zeroshard.Error(f"zeroshard.pipe: {message}")


class ProcessTopology:
    """Ranks as coordinates over `axes` of sizes `dims`, row-major."""

    def __init__(self, axes, dims):
        if len(axes) != len(dims) or len(set(axes)) != len(axes):
            raise _error(f"ProcessTopology(axes={axes}, dims={dims}); allowed: distinct axis "
                         "names, one size each")
        self.axes, self.dims = list(axes), [int(d) for d in dims]
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)
        self.mapping = {self.ProcessCoord(*c): r for r, c in
                        enumerate(itertools.product(*[range(d) for d in self.dims]))}

    def get_axis_names(self):
        return self.axes

    def get_dim(self, axis):
        return self.dims[self.axes.index(axis)] if axis in self.axes else None

    def world_size(self):
        size = 1
        for d in self.dims:
            size *= d
        return size

    def get_rank(self, **coord):
        return self.mapping[self.ProcessCoord(**coord)]

    def get_coord(self, rank):
        for coord, r in self.mapping.items():
            if r == rank:
                return coord
        raise _error(f"rank {rank} is not in a topology of {self.world_size()} ranks")


class PipeDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp, num_dp):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp, num_mp, num_dp):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])


def pipe_and_data(topology, world):
    """(stages, data-parallel size) of a topology (zeroshard's or DeepSpeed's) that zeroshard
    lays out as it does: 'pipe' outermost, then 'data', any other axis of size 1."""
    axes = list(topology.get_axis_names())
    dims = {axis: int(topology.get_dim(axis)) for axis in axes}
    others = {axis: size for axis, size in dims.items() if axis not in ("pipe", "data")}
    if axes[:2] != ["pipe", "data"] or any(size != 1 for size in others.values()):
        raise _error(f"topology with axes {axes} and sizes {[dims[a] for a in axes]}; allowed: "
                     "'pipe' then 'data' outermost, any other axis of size 1 (a 'model' axis "
                     "over 1 rank: tensor parallelism inside a PipelineModule is not supported "
                     "yet; torch's pipelining with a Megatron mpu is)")
    if dims["pipe"] * dims["data"] != world:
        raise _error(f"topology of {dims['pipe']} stages x {dims['data']} data-parallel ranks "
                     f"= {dims['pipe'] * dims['data']} ranks, but the world has {world}; "
                     "allowed: the world's size")
    return dims["pipe"], dims["data"]
