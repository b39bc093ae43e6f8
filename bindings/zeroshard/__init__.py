"""zeroshard: ZeRO sharding (stages 0-3) with host/NVMe offload for ordinary PyTorch
models, a C++ runtime behind a deepspeed.initialize-shaped API.

    engine, optimizer, _, scheduler = zeroshard.initialize(model=model,
                                                           config="configs/zero3.yaml")
    for batch in data:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
"""
from ._zeroshard import Error
from .config import load_config
from .consolidate import consolidate
from .engine import ZeroShardEngine, initialize
from .estimate import estimate

__all__ = ["Error", "ZeroShardEngine", "initialize", "estimate", "load_config", "consolidate"]
