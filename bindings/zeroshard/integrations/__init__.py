"""zeroshard.integrations: the training frameworks' front-ends, one module per framework,
each importing only its own library when it is imported:

- transformers: ZeroShardTrainer (the Hugging Face Trainer), zeroshard_trainer(cls) for its
  subclasses (TRL's, Seq2SeqTrainer), trainer_config;
- accelerate: Accelerator (accelerate's, the model prepared by the engine);
- lightning: ZeroShardStrategy (Lightning's Trainer) and ZeroShardFabricStrategy (Fabric);
  importing it registers the strategy names (zeroshard, zeroshard_stage_3, ...).

`from zeroshard.integrations import X` finds each of them. These modules sit above the
engine (zeroshard._engine) and import nothing above themselves."""
import importlib

_HOME = {"ZeroShardTrainer": "transformers", "zeroshard_trainer": "transformers",
         "trainer_config": "transformers", "Accelerator": "accelerate",
         "ZeroShardStrategy": "lightning", "ZeroShardFabricStrategy": "lightning"}


def __getattr__(name):
    """Each name made when first asked for, from its framework's module (which imports
    that framework only)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
