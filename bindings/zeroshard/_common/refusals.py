"""DeepSpeed's names that zeroshard does not carry, each refused by name: importing one of
its modules, or reading one of its attributes from the zeroshard module of the same path,
raises zeroshard.Error saying what it is and what to use instead (an ImportError too, for
scripts that fall back where a name is missing), never a bare ModuleNotFoundError or
AttributeError; hasattr() of a refused name raises it as well. Every other name of DeepSpeed's tree that scripts
use works under zeroshard's module of the same path (tests/python/test_deepspeed_names.py
checks the list made from DeepSpeedExamples, Megatron-DeepSpeed, transformers, accelerate
and TRL)."""
import importlib
import importlib.abc
import sys

from .. import _zeroshard

_KERNELS = ("a DeepSpeed CUDA kernel; zeroshard runs the model's own torch modules",
            "the model's torch layers (transformers' BERT or GPT layers; "
            "torch.nn.functional.scaled_dot_product_attention for attention)")
_FPDT = ("DeepSpeed's FPDT (chunked attention with its chunks offloaded) is not in zeroshard",
         "zeroshard.sequence.layer.DistributedAttention (Ulysses) around the model's attention")
_AUTO_SP = ("DeepSpeed's automatic Ulysses wrapping of a model's attention modules is not in "
            "zeroshard", "zeroshard.sequence.layer.DistributedAttention around the "
            "model's attention")
_VOCAB_LOSS = ("DeepSpeed's vocabulary-parallel cross entropy is not in zeroshard",
               "torch.nn.functional.cross_entropy on each rank's slice of the sequence, with "
               "full logits")
_GROUPS = ("DeepSpeed's registry of expert-, tensor- and hierarchical-ZeRO process groups",
           "torch.distributed groups of your own; the sequence-, data- and expert-parallel getters of "
           "zeroshard.utils.groups")
_TILED = ("ALST's generic tiled compute (any function over sequence tiles) is not in "
          "zeroshard yet", "TiledMLP and TiledFusedLogitsLoss from the same module (the MLP, "
          "and the logits with their loss, in sequence tiles)")
_COMPRESSION = ("DeepSpeed's compression library (quantization-aware training, pruning, "
                "layer reduction) is not in zeroshard", "torch.ao.quantization or torchao")
_RANDOM_LTD = ("DeepSpeed's data efficiency library (random layer-token drop, curriculum "
               "sampling, data analysis) is not in zeroshard",
               "the full sequence through every layer, with a torch DataLoader of your order")
_NON_REENTRANT = ("DeepSpeed's non-reentrant checkpoint with partitioned or CPU-held "
                  "checkpoints (through saved-tensor hooks)",
                  "zeroshard.checkpointing.checkpoint (the activation_checkpointing keys apply), "
                  "or torch.utils.checkpoint.checkpoint(use_reentrant=False)")
_UNIVERSAL = ("DeepSpeed's universal checkpoint format is not what zeroshard writes",
              "zeroshard.convert_deepspeed_checkpoint to read a DeepSpeed checkpoint, "
              "zeroshard.consolidate for a whole state_dict")

# {the path below deepspeed: (what it is, what to use instead)}; a module's entry covers
# everything below it.
REFUSED = {
    "ops.sparse_attention": ("DeepSpeed's block-sparse attention (Triton kernels, gone from "
                             "DeepSpeed itself)", _KERNELS[1]),
    "ops.lion": ("DeepSpeed's Lion optimizer kernels", "an optimizer torch.optim has "
                 "(AdamW, Adam, Adagrad, SGD...), given to initialize or named in the config"),
    "ops.op_builder": ("DeepSpeed's JIT builders of its C++/CUDA ops; zeroshard's ops are "
                       "built with it (its io_uring engine serves NVMe offload)",
                       "the config's offload_optimizer/offload_param with device nvme"),
    "module_inject": ("DeepSpeed's kernel injection for inference", "zeroshard.init_inference, "
                      "which runs the model's own modules"),
    "replace_transformer_layer": ("DeepSpeed's kernel injection for inference",
                                  "zeroshard.init_inference"),
    "tp_model_init": ("DeepSpeed's AutoTP initializer", "the config's "
                      "tensor_parallel.autotp_size (the model split by its own tp_plan)"),
    "compile": ("DeepCompile (DeepSpeed's compiler passes)", "torch.compile of the model"),
    "compression.compress": _COMPRESSION,
    "compression.basic_layer": _COMPRESSION,
    "compression.scheduler": _COMPRESSION,
    "compression.helper.convert_conv1d_to_linear": _COMPRESSION,
    "compression.init_compression": _COMPRESSION,
    "compression.redundancy_clean": _COMPRESSION,
    "runtime.data_pipeline": _RANDOM_LTD,
    "runtime.domino": ("Domino (DeepSpeed's tensor-parallel overlap of Megatron layers)",
                       "tensor parallelism through a Megatron mpu or a tp_plan"),
    "runtime.fp16": ("DeepSpeed's FP16_Optimizer classes; zeroshard's engine keeps the loss "
                     "scale and the fp32 master itself", "the config's fp16 section"),
    "runtime.pipe.engine.PipelineEngine._INSTRUCTION_MAP": (
        "DeepSpeed's pipeline instruction table; zeroshard's pipeline engine runs "
        "torch.distributed.pipelining's schedules", "engine.train_batch(), or a schedule of "
        "zeroshard.pipelining"),
    "runtime.pipe.schedule": ("DeepSpeed's pipeline instruction schedules; zeroshard's "
                              "pipeline engine runs torch.distributed.pipelining's",
                              "engine.train_batch(), or zeroshard.pipelining's schedules"),
    "checkpointing.non_reentrant_checkpoint": _NON_REENTRANT,
    "runtime.activation_checkpointing.checkpointing.non_reentrant_checkpoint": _NON_REENTRANT,
    "runtime.sequence_parallel.ulysses_sp.SequenceTiledCompute": _TILED,
    "runtime.sequence_parallel.ulysses_sp.sequence_tiled_compute": _TILED,
    "runtime.sequence_parallel.ulysses_sp.AutogradComputeMLP": _TILED,
    "sequence.fpdt_layer": _FPDT,
    "sequence.auto_sp": _AUTO_SP,
    "sequence.auto_wrap_model_for_sp": _AUTO_SP,
    "sequence.autosp_detector": _AUTO_SP,
    "sequence.detect_model_sp_info": _AUTO_SP,
    "sequence.SPModelInfo": _AUTO_SP,
    "sequence.autosp_vit": _AUTO_SP,
    "sequence.UlyssesSPViTAttention": _AUTO_SP,
    "sequence.autosp_fusion": _AUTO_SP,
    "sequence.ModalityFusionSPAdapter": _AUTO_SP,
    "sequence.LlavaFusionAdapter": _AUTO_SP,
    "sequence.InternVLFusionAdapter": _AUTO_SP,
    "sequence.Qwen2VLFusionAdapter": _AUTO_SP,
    "sequence.cross_entropy": _VOCAB_LOSS,
    "sequence.linear_cross_entropy": _VOCAB_LOSS,
    "sequence.vocab_parallel_ops": _VOCAB_LOSS,
    "sequence.VocabParallelCausalLMLoss": _VOCAB_LOSS,
    "sequence.VocabParallelCrossEntropyLoss": _VOCAB_LOSS,
    "sequence.configure_vocab_parallel_loss": _VOCAB_LOSS,
    "sequence.vocab_parallel_cross_entropy": _VOCAB_LOSS,
    "utils.groups._create_expert_and_data_parallel": _GROUPS,
    "utils.groups._create_expert_data_and_model_parallel": _GROUPS,
    "utils.groups._create_model_parallel": _GROUPS,
    "utils.groups._get_model_parallel_world_size": _GROUPS,
    "utils.groups._get_data_parallel_group_ranks": _GROUPS,
    "utils.groups._get_broadcast_src_rank": _GROUPS,
    "utils.groups._get_local_all_to_all_group": _GROUPS,
    "utils.groups._get_zero_param_intra_parallel_group": _GROUPS,
    "utils.groups._get_zero_param_intra_parallel_rank_in_mygroup": _GROUPS,
    "utils.groups._get_zero_param_intra_parallel_group_world_size": _GROUPS,
    "utils.groups._get_zero_param_intra_parallel_group_ranks": _GROUPS,
    "utils.groups._clone_world_group": _GROUPS,
    "utils.groups._create_zero_param_parallel_group": _GROUPS,
    "utils.groups._get_expert_parallel_ranks": _GROUPS,
    "utils.groups._get_max_expert_parallel_group": _GROUPS,
    "utils.groups._zero_param_parallel_is_initialized": _GROUPS,
    "utils.groups.get_data_parallel_group": _GROUPS,
    "utils.groups.get_data_parallel_rank": _GROUPS,
    "utils.groups.get_data_parallel_world_size": _GROUPS,
    "utils.groups.get_model_parallel_group": _GROUPS,
    "utils.groups.get_model_parallel_rank": _GROUPS,
    "utils.groups.get_model_parallel_world_size": _GROUPS,
    "utils.groups.get_tensor_model_parallel_group": _GROUPS,
    "utils.groups.get_tensor_model_parallel_rank": _GROUPS,
    "utils.groups.get_tensor_model_parallel_src_rank": _GROUPS,
    "utils.groups.get_tensor_model_parallel_world_size": _GROUPS,
    "utils.groups.initialize": _GROUPS,
    "utils.groups.set_tensor_model_parallel_rank": _GROUPS,
    "utils.groups.set_tensor_model_parallel_world_size": _GROUPS,
    "runtime.utils.PartitionedTensor": ("Megatron-DeepSpeed's partitioned pipeline "
                                        "activations", "zeroshard's pipeline engine, which "
                                        "sends whole activations between stages"),
    "utils.set_z3_leaf_modules": ("DeepSpeed's ZeRO-3 leaf marking", "initialize(units=[...]): "
                                  "each unit is gathered whole before its forward"),
    "utils.safe_get_full_fp32_param": ("DeepSpeed's read of a parameter's fp32 master",
                                       "zeroshard.zero.GatheredParameters for the parameter's "
                                       "value, engine.save_checkpoint for the master"),
    "checkpoint.ORIGINAL_VOCAB_SIZE": _UNIVERSAL,
    "checkpoint.PADDED_VOCAB_SIZE": _UNIVERSAL,
    "checkpoint.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0": _UNIVERSAL,
    "checkpoint.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS": _UNIVERSAL,
    "checkpoint.PIPELINE_REPLICATED_PARAMETER_PATTERNS": _UNIVERSAL,
    "checkpoint.TP_REPLICATED_PARAMETER_PATTERNS": _UNIVERSAL,
    "checkpoint.UNIVERSAL_CHECKPOINT_INFO": _UNIVERSAL,
    "checkpoint.UNIVERSAL_CHECKPOINT_VERSION_KEY": _UNIVERSAL,
    "checkpoint.UNIVERSAL_CHECKPOINT_VERSION_VALUE": _UNIVERSAL,
    "checkpoint.VOCABULARY_PARAMETER_PATTERNS": _UNIVERSAL,
    "checkpoint.ds_to_universal": _UNIVERSAL,
    "checkpoint.universal_checkpoint": _UNIVERSAL,
    "inference.DeepSpeedTPConfig": ("DeepSpeed's inference tensor-parallel config",
                                    "zeroshard.init_inference(model, config=...)"),
    "inference.v2": ("DeepSpeed-FastGen (ragged batching, its CUDA kernels)",
                     "zeroshard.init_inference"),
    "inference.RaggedInferenceEngineConfig": ("DeepSpeed-FastGen (ragged batching)",
                                              "zeroshard.init_inference"),
    "io": ("DeepSpeed's FastFileWriter (its checkpoint writer over aio/GDS)",
           "engine.save_checkpoint, which writes through zeroshard's own io engine"),
    "env_report": ("DeepSpeed's environment report (its ops' build status)",
                   "`python -m zeroshard --help` and zeroshard-estimate"),
    "comm.TorchBackend": ("DeepSpeed's communication backend object",
                          "zeroshard.comm's functions, or torch.distributed"),
    "runtime.config.ONEBIT_LAMB_OPTIMIZER": ("DeepSpeed's 1-bit LAMB (gone from DeepSpeed "
                                             "itself)", "optimizer type Lamb"),
}


class RefusedName(_zeroshard.Error, ImportError):
    """A DeepSpeed name zeroshard lacks, read or imported: a zeroshard.Error, and an
    ImportError, so that a script's `try: from deepspeed.x import y / except ImportError:`
    fallback works as where DeepSpeed lacks it."""


class RefusedModule(RefusedName, ModuleNotFoundError):
    """A DeepSpeed module zeroshard lacks, imported."""


def refusal(path, kind=RefusedName):
    """The error for `path` (below deepspeed), or None where it is no refused name."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in REFUSED:
            what, instead = REFUSED[key]
            return kind(f"deepspeed.{path} is not in zeroshard: {what}; instead: {instead}")
    return None


def attribute_refuser(module_name, lazy=()):
    """A module's __getattr__: a `lazy` submodule is imported when first read; a refused
    name raises its Error; any other missing name is an AttributeError, as Python's own."""
    below = module_name[len("zeroshard"):].lstrip(".")

    def __getattr__(name):
        if name in lazy:
            return importlib.import_module(f"{module_name}.{name}")
        error = None if name.startswith("__") else refusal(f"{below}.{name}".lstrip("."))
        if error is not None:
            raise error
        raise AttributeError(f"module '{module_name}' has no attribute '{name}'")
    return __getattr__


class Refused:
    """A refused name that must exist as an attribute (DeepSpeed scripts reach through it):
    any use of it raises its Error."""

    def __init__(self, path):
        self._path = path

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise refusal(self._path)

    def _refuse(self, *args, **kwargs):
        raise refusal(self._path)

    __call__ = __getitem__ = __setitem__ = __delitem__ = __iter__ = __contains__ = _refuse


class _RefusedModules(importlib.abc.MetaPathFinder):
    """`import zeroshard.X` for a refused module X raises its Error."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("zeroshard."):
            error = refusal(fullname[len("zeroshard."):], RefusedModule)
            if error is not None:
                raise error
        return None


def install():
    if not any(isinstance(f, _RefusedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _RefusedModules())
