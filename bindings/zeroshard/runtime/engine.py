"""deepspeed.runtime.engine: DeepSpeedEngine is zeroshard's engine class, so that
`isinstance(model, DeepSpeedEngine)` holds for what zeroshard.initialize returns."""
from .._engine.engine import ZeroShardEngine as DeepSpeedEngine  # noqa: F401
