"""deepspeed.runtime.config: DeepSpeedConfig (a config read, checked and its batch keys
resolved as the engine does, with DeepSpeed's attribute names) and the optimizer type names
DeepSpeed's config takes."""
from .._common import config as _config, refusals as _refusals
from .. import _zeroshard

ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER = "adam", "adamw", "lamb"
ADAGRAD_OPTIMIZER, SGD_OPTIMIZER = "adagrad", "sgd"

__getattr__ = _refusals.attribute_refuser(__name__)


class DeepSpeedConfig:
    """deepspeed.DeepSpeedConfig(config, mpu=None): `config` (a path or a dict) checked by
    zeroshard's loader (an unknown or refused key is an Error naming it), its batch keys
    resolved over the data-parallel ranks (the mpu's, or torch.distributed's world, or 1),
    and DeepSpeed's attributes read from it."""

    def __init__(self, config, mpu=None, mesh_device=None):
        if mesh_device is not None:
            raise _zeroshard.Error("DeepSpeedConfig(mesh_device=...): device meshes are not "
                                   "supported; allowed: None")
        self._param_dict, self._origin = _config.as_mapping(config)
        loaded = _config.parse(self._param_dict)
        ranks = self._data_parallel_ranks(mpu)
        (self.train_batch_size, self.train_micro_batch_size_per_gpu,
         self.gradient_accumulation_steps) = _zeroshard.resolved_batch(loaded, ranks)
        # As DeepSpeed's: the ranks that see different samples.
        self.world_size = ranks // int(self._param_dict.get("sequence_parallel_size", 1))
        d = self._param_dict
        zero = d.get("zero_optimization") or {}
        self.zero_optimization_stage = int(zero.get("stage", 0)) if zero.get("stage") != "auto" \
            else loaded.stage
        self.zero_enabled = bool(self.zero_optimization_stage)
        self.fp16_enabled = bool((d.get("fp16") or {}).get("enabled", False))
        self.bfloat16_enabled = bool((d.get("bf16") or d.get("bfloat16") or {}).get("enabled",
                                                                                   False))
        self.gradient_clipping = d.get("gradient_clipping", 0.0)
        optimizer, scheduler = d.get("optimizer") or {}, d.get("scheduler") or {}
        self.optimizer_name = optimizer.get("type", "").lower() or None
        self.optimizer_params = optimizer.get("params")
        self.scheduler_name = scheduler.get("type")
        self.scheduler_params = scheduler.get("params")
        self.steps_per_print = d.get("steps_per_print", 10)
        self.wall_clock_breakdown = d.get("wall_clock_breakdown", False)
        self.sparse_attention = d.get("sparse_attention")  # refused by the loader when set
        self.dataloader_drop_last = d.get("dataloader_drop_last", False)

    @staticmethod
    def _data_parallel_ranks(mpu):
        if mpu is not None:
            return mpu.get_data_parallel_world_size()
        import torch.distributed as dist
        return dist.get_world_size() if dist.is_initialized() else 1

    def print(self, name):
        print(f"{name}:")
        for key in sorted(vars(self)):
            if not key.startswith("_"):
                print(f"  {key} {'.' * (29 - len(key))} {getattr(self, key)}")
