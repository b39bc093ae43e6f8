"""What the engine writes and reads: ordinary state_dicts (whole parameters), Hugging
Face folders, 16-bit weight files, and its sharded checkpoints with DeepSpeed's
save_checkpoint / load_checkpoint keywords (a mixin of ZeroShardEngine, _engine/engine.py)."""
import json
import os

import torch

from .._checkpoint import deepspeed_checkpoint as _deepspeed_checkpoint
from .. import _zeroshard
from .._experts.expert_state import whole_state
from .._parallel.tensor_parallel import join_slices
from .units import unique_parameters


class SavingMethods:
    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin",
                         exclude_frozen_parameters=False):
        """The whole model's state_dict in its training precision, written by rank 0 to
        save_dir/save_filename (a collective at stage 3: every rank calls it). DeepSpeed
        gathers at stage 3 only with stage3_gather_16bit_weights_on_model_save; here it
        always does. Returns True."""
        state = self._whole_state(exclude_frozen_parameters)
        dtype = torch.bfloat16 if self.bfloat16_enabled() else \
            torch.float16 if self.fp16_enabled() else None
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        if self.rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(os.fspath(save_dir), save_filename)
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)  # atomic: an old file stays whole until then
        self._engine.barrier()
        return True

    def full_parameters(self):
        """Whole copies of every parameter (a collective at stage 3, with tensor
        parallelism, whose slices are joined, and with expert parallelism, whose experts
        come from every rank of the group: call on every rank). With experts split, the
        names are the whole model's (_experts/expert_state.py)."""
        return whole_state(self.module, self._local_full_parameters())

    def _local_full_parameters(self):
        full = dict(self._engine.full_parameters())
        if self._same_inputs is not None:
            join_slices(full, self._tensor_parallel_split, self._same_inputs)
        return full

    def state_dict(self):
        """An ordinary state_dict (full tensors, tied parameters under every name): the
        whole model's, every expert in it where expert parallelism split them, as a model
        holding all of them (ep_size 1) has it. A collective: call on every rank."""
        return self._whole_state()

    def _whole_state(self, exclude_frozen=False):
        full = self._local_full_parameters()
        by_id = {id(p): full[n] for n, p in unique_parameters(self.module)}
        out = {}
        for prefix, mod in self.module.named_modules():
            dot = prefix + "." if prefix else ""
            for name, p in mod._parameters.items():
                if p is not None:
                    out[dot + name] = by_id[id(p)]
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent_buffers_set:
                    out[dot + name] = b.detach().clone()
        if exclude_frozen:  # before the experts are joined: by this rank's names
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            out = {k: v for k, v in out.items() if k not in frozen}
        return whole_state(self.module, out)

    def save_pretrained(self, save_directory, **kwargs):
        """Hugging Face's layout in save_directory: safetensors shards (with their index
        when there are several) and config.json, which `from_pretrained` loads. The
        model's own save_pretrained writes it from the full parameters (tied ones once,
        as Hugging Face does); its other keywords (max_shard_size, variant, ...) pass
        through. A collective: every rank calls it, rank 0 writes, and it returns on every
        rank once the folder is complete. Files written first in a sibling folder are
        moved in one by one, the index and config.json last; other files already in the
        folder (a tokenizer, say) stay, old weight shards go."""
        save = getattr(self.module, "save_pretrained", None)
        if save is None:
            raise _zeroshard.Error(
                f"save_pretrained: the model is a {type(self.module).__name__}, which has no "
                "save_pretrained (it is not a Hugging Face PreTrainedModel); use "
                "engine.state_dict(), or save_checkpoint() and zeroshard.consolidate(..., "
                "format='safetensors')")
        for key in ("state_dict", "is_main_process", "push_to_hub"):
            if key in kwargs:
                raise _zeroshard.Error(
                    f"save_pretrained: '{key}' is not allowed here: zeroshard gathers the "
                    "state_dict and writes from rank 0 (push the folder afterwards with "
                    "huggingface_hub if you need to)")
        state = self.state_dict()  # every rank: a collective at stage 3
        if self.rank == 0:
            from .._checkpoint.consolidate import write_into_folder_atomically
            write_into_folder_atomically(os.fspath(save_directory),
                           lambda tmp: save(tmp, state_dict=state, **kwargs))
        self._engine.barrier()

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False):
        """Each rank writes its shards to save_dir/tag (default global_stepN), rank 0 the
        manifest; save_dir/latest moves last, unless save_latest is False.
        client_state must be plain data (JSON). The parameter groups' hyperparameters and
        a client LR scheduler's state_dict are stored too, as DeepSpeed stores them. With
        exclude_frozen_parameters, parameters that do not train are left out (the model
        they come from supplies them again: load with load_module_strict=False). A
        collective. Returns the tag."""
        try:
            text = json.dumps(client_state or {})
        except TypeError as e:
            raise _zeroshard.Error(f"client_state must be plain data (JSON): {e}") from None
        scheduler = ""
        if self.lr_scheduler is not None:
            try:
                scheduler = json.dumps(self.lr_scheduler.state_dict())
            except TypeError as e:
                raise _zeroshard.Error(
                    f"lr_scheduler: the state_dict of the {type(self.lr_scheduler).__name__} "
                    f"is not plain data (JSON), so the checkpoint cannot hold it: {e}") from None
        self.optimizer.push_groups()  # the groups as they are now
        return self._engine.save_checkpoint(
            os.fspath(save_dir), tag or "", text, scheduler, latest=bool(save_latest),
            frozen_parameters=not exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None):
        """Loads load_dir/tag (default: the tag load_dir/latest names), saved at any world
        size and stage. By default everything: the model, the optimizer's state, the
        parameter groups' hyperparameters, the step counts, the schedule's position and a
        client LR scheduler's state. DeepSpeed's keywords narrow it:
        load_optimizer_states=False keeps the optimizer's own state (its fp32 master
        restarts from the loaded weights); load_lr_scheduler_states=False keeps the
        schedule where it is; load_module_only=True loads parameters and buffers alone (a
        warm start); load_module_strict=False lets either side lack parameters or buffers
        (the model keeps its values for what the checkpoint lacks).
        Returns (path, client_state) as DeepSpeed does, and (None, None) with a warning
        when tag is None and load_dir has no `latest`. A checkpoint DeepSpeed saved is
        converted on the way in (zeroshard.convert_deepspeed_checkpoint), its files read
        without running anything they name (to read files you trust that hold other
        types: convert_deepspeed_checkpoint(..., trust_checkpoint=True), then load that)."""
        if custom_load_fn is not None:
            raise _zeroshard.Error(
                "load_checkpoint(custom_load_fn=...): not supported; allowed: None (the "
                "engine loads every shard itself; to load weights your own way, do it "
                "inside engine.gathered_parameters(modifier_rank=0))")
        load_dir = os.fspath(load_dir)
        ds_folder = _deepspeed_checkpoint.folder_of(load_dir, tag)
        if tag is None and ds_folder is None and not os.path.isfile(
                os.path.join(load_dir, "latest")):
            if self.rank == 0:
                print(f"zeroshard: load_checkpoint: '{load_dir}' has no 'latest' file, so "
                      "nothing was loaded (pass a tag to load a given checkpoint)", flush=True)
            return None, None
        options = dict(strict=bool(load_module_strict),
                       optimizer_states=bool(load_optimizer_states),
                       lr_scheduler=bool(load_lr_scheduler_states),
                       module_only=bool(load_module_only))
        if ds_folder is not None:
            _, state = _deepspeed_checkpoint.loaded_through_conversion(
                load_dir, tag, lambda tmp, name: self._load(tmp, name, options))
            return ds_folder, state
        return self._load(load_dir, tag, options)

    def _load(self, load_dir, tag, options):
        state, scheduler = self._engine.load_checkpoint(load_dir, tag or "", **options)
        if options["optimizer_states"] and not options["module_only"]:
            self.optimizer.pull_groups()
        elif self._scheduled:  # the schedule's position may have moved
            self.optimizer.show_scheduled_lr()
        scheduler = json.loads(scheduler)
        if scheduler is not None and self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(scheduler)
        if tag is None:
            with open(os.path.join(load_dir, "latest")) as f:
                tag = f.read().strip()
        return os.path.join(load_dir, tag), json.loads(state)
