"""zeroshard.runtime.zero: deepspeed.runtime.zero's names (Init, GatheredParameters, and
the partition_parameters and offload_config modules)."""
from ...zero import GatheredParameters, Init  # noqa: F401
from . import offload_config, partition_parameters  # noqa: F401
