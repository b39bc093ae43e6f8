"""deepspeed.runtime.zero.partition_parameters: Init, GatheredParameters and ZeroParamStatus.
zeroshard's stage-3 parameters carry no ds_status (scripts test hasattr(p, "ds_id") first,
and gather with GatheredParameters either way)."""
from enum import Enum

from ...zero import GatheredParameters, Init  # noqa: F401


class ZeroParamStatus(Enum):
    AVAILABLE = 1  # whole on every rank
    NOT_AVAILABLE = 2  # partitioned
    INFLIGHT = 3  # being gathered
