"""DeepSpeed's engine accessors, with its names and meanings: a mixin of ZeroShardEngine
(engine.py), read off the C++ engine and the engine's optimizer."""
from .. import _zeroshard


class EngineAccessors:
    @property
    def global_rank(self):
        return self._engine.rank

    @property
    def local_rank(self):
        return _zeroshard.launch_env()["local_rank"]

    @property
    def device(self):
        """Where the model trains: its parameters' device."""
        return next(self.module.parameters()).device

    def fp16_enabled(self):
        return self._engine.fp16

    def bfloat16_enabled(self):
        return self._engine.bf16

    def zero_optimization(self):
        return self._engine.shards_optimizer

    def zero_optimization_stage(self):
        return self._engine.stage

    def train_batch_size(self):
        """Samples per optimizer step over all ranks: micro-batch x accumulation x
        data-parallel ranks (tensor- and sequence-parallel ranks share their samples)."""
        return (self.train_micro_batch_size_per_gpu() * self.gradient_accumulation_steps()
                * self.dp_world_size)

    def is_gradient_accumulation_boundary(self):
        """True when the next engine.step() ends an accumulation window (steps the
        optimizer), as DeepSpeed counts micro-steps."""
        # The engine counts a micro-step at each (last pipeline stage's) backward, restored
        # by a checkpoint; DeepSpeed counts at each step().
        done = self._engine.micro_steps - (1 if self._pending_backward else 0)
        return self._engine.ends_accumulation(done + 1)

    def get_global_grad_norm(self):
        """The gradients' global norm at the last optimizer step (before clipping)."""
        return self._engine.global_grad_norm

    def was_step_applied(self):
        """False when the last window's step was skipped (fp16 overflow)."""
        return self._step_applied

    def no_sync(self):
        raise _zeroshard.Error(
            "engine.no_sync(): zeroshard reduces gradients once per accumulation window "
            "already; set gradient_accumulation_steps in the config and call engine.step() "
            "after every backward (DeepSpeed also refuses no_sync at stages 2 and 3)")

    def get_lr(self):
        """Every parameter group's lr for the next step."""
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_mom(self):
        """Every parameter group's momentum for the next step, as DeepSpeed reports it: the
        betas of Adam-like optimizers, `momentum` where the optimizer has that instead."""
        key = "momentum" if "momentum" in self.optimizer.param_groups[0] and \
            "betas" not in self.optimizer.param_groups[0] else "betas"
        return [g.get(key) for g in self.optimizer.param_groups]

    @property
    def skipped_steps(self):
        """Optimizer steps an fp16 overflow skipped (counted in global_steps too)."""
        return self._engine.skipped_steps

    @property
    def loss_scale(self):
        return self._engine.loss_scale

    @property
    def global_grad_norm(self):
        return self._engine.global_grad_norm

    @property
    def global_steps(self):
        """Optimizer steps taken, counting the ones a loaded checkpoint had taken."""
        return self._engine.global_steps

    def gradient_accumulation_steps(self):
        """Micro-batches per optimizer step (DeepSpeed's accessor)."""
        return self._engine.gradient_accumulation_steps

    def train_micro_batch_size_per_gpu(self):
        """Samples per rank per micro-batch, the config's value (DeepSpeed's accessor)."""
        return self._engine.micro_batch_size

    def get_batch_info(self):
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps),
        the numbers DeepSpeed's docstring promises (DeepSpeed 0.19.8 returns the first two
        as bound methods)."""
        return (self.train_batch_size(), self.train_micro_batch_size_per_gpu(),
                self.gradient_accumulation_steps())

    def gradient_clipping(self):
        """The global gradient norm the step clips to (0: no clipping)."""
        return self._engine.gradient_clipping

    @property
    def global_samples(self):
        """Samples the optimizer steps so far have taken, over all ranks."""
        return self.global_steps * self.train_batch_size()

    @property
    def scheduled_by_config(self):
        """True when the config's `scheduler` sets every group's lr at each step."""
        return self._scheduled

    @property
    def zero_stage(self):
        return self._engine.stage

    @property
    def plan(self):
        return self._engine.plan_label
