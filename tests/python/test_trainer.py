"""The Hugging Face Trainer with zeroshard (zeroshard.integrations.ZeroShardTrainer) on
2 real ranks against the same Trainer under DDP: the same TrainingArguments (AdamW with
the Trainer's decay and no-decay groups, linear warmup and decay, gradient accumulation
4, clipping at 1.0), on rows whose prompts of different lengths are masked out of the
loss, log the same loss and grad norm every step (within 1e-5: the Trainer's token-weighted
arithmetic, num_items_in_batch), and save_model writes a folder from_pretrained loads to
DDP's trained weights (within 1e-5). Config values
that contradict TrainingArguments are refused naming both."""
import importlib.util
import json
import os

import pytest
import torch

from conftest import HERE, run_ranks

pytestmark = pytest.mark.skipif(  # a mark, not a skip at import (see test_hf_models.py)
    importlib.util.find_spec("accelerate") is None,
    reason="accelerate (the Trainer's dependency) is not installed beside this interpreter "
           "(the trixie leg): the main leg runs these tests")

WORKER = os.path.join(HERE, "trainer_worker.py")
STEPS, WORLD = 6, 2
_reference = {}


def trainer_run(mode, scratch, config=None, tag=None, env=None, world=WORLD):
    out = str(scratch / (tag or mode))
    args = [WORKER, mode, str(STEPS), out] + ([json.dumps(config)] if config else [])
    return run_ranks(args, world, out, timeout=600, extra_env=env), out


def ddp(scratch, optim="adamw_torch"):
    if optim not in _reference:
        _reference[optim] = trainer_run("ddp", scratch, tag=f"ddp-{optim}",
                                        env={"ZS_TRAINER_OPTIM": optim})
    return _reference[optim]


@pytest.mark.parametrize("zero,optim", [({"stage": 3}, "adamw_torch"),
                                        ({"stage": 2, "offload_optimizer": {"device": "cpu"}},
                                         "adamw_torch"),
                                        ({"stage": 3}, "adagrad"),
                                        ({"stage": 3}, "adafactor")],
                         ids=["stage3", "stage2-cpu-optimizer", "stage3-adagrad",
                              "stage3-adafactor"])
def test_trainer_logs_ddps_losses_and_saves_its_weights(zero, optim, scratch):
    """TrainingArguments.optim "adagrad": the Trainer's own torch.optim.Adagrad, stepped on
    the shards; "adafactor": transformers' Adafactor, its row and column statistics summed
    across the shards."""
    import transformers
    want, want_out = ddp(scratch, optim)
    got, got_out = trainer_run("zs", scratch, {"zero_optimization": zero,
                                               "gradient_accumulation_steps": "auto"},
                               tag=f"zs-{optim}", env={"ZS_TRAINER_OPTIM": optim})
    for rank in range(WORLD):
        assert len(got[rank]) == len(want[rank]) == STEPS
        for step, ((loss, norm), (loss_ddp, norm_ddp)) in enumerate(zip(got[rank], want[rank])):
            assert abs(loss - loss_ddp) <= 1e-5 * abs(loss_ddp), f"step {step}: {loss} vs {loss_ddp}"
            assert abs(norm - norm_ddp) <= 1e-5 * abs(norm_ddp), f"step {step}: {norm} vs {norm_ddp}"
    assert got[0][-1][0] < got[0][0][0], "the loss did not fall"
    mine = transformers.LlamaForCausalLM.from_pretrained(got_out + ".model").state_dict()
    theirs = transformers.LlamaForCausalLM.from_pretrained(want_out + ".model").state_dict()
    assert set(mine) == set(theirs)
    for name, t in theirs.items():
        assert torch.allclose(mine[name], t, rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("how", ["deepspeed-argument", "no-config"])
def test_a_deepspeed_trainer_script_switches_with_the_import_alone(how, scratch):
    """TrainingArguments(deepspeed="ds_config.json") (a script's --deepspeed flag) gives the
    engine its config; with no config at all the planner picks the stage. Either way the
    Trainer logs DDP's losses."""
    want, _ = ddp(scratch)
    if how == "deepspeed-argument":
        got, _ = trainer_run("zs-deepspeed", scratch, {"zero_optimization": {"stage": 3},
                                                       "gradient_accumulation_steps": "auto",
                                                       "train_micro_batch_size_per_gpu": "auto"},
                             tag="zs-deepspeed")
    else:
        got, _ = trainer_run("zs", scratch, tag="zs-no-config")
    for rank in range(WORLD):
        assert len(got[rank]) == STEPS
        for step, ((loss, norm), (loss_ddp, norm_ddp)) in enumerate(zip(got[rank], want[rank])):
            assert abs(loss - loss_ddp) <= 1e-5 * abs(loss_ddp), f"step {step}: {loss} vs {loss_ddp}"
            assert abs(norm - norm_ddp) <= 1e-5 * abs(norm_ddp), f"step {step}: {norm} vs {norm_ddp}"


def test_trainer_with_tensor_parallelism_logs_ddps_losses(scratch):
    """tensor_parallel.autotp_size 2 on 4 ranks (the Llama split by its own tp_plan, ZeRO-3
    over 2 data-parallel ranks): each tp pair takes one batch, so the Trainer logs what DDP
    on 2 ranks logs, and saves the whole model."""
    import transformers
    want, want_out = ddp(scratch)
    got, got_out = trainer_run("zs", scratch, {"zero_optimization": {"stage": 3},
                                               "tensor_parallel": {"autotp_size": 2}},
                               tag="zs-tp", world=2 * WORLD)
    for rank in range(2 * WORLD):
        assert len(got[rank]) == STEPS
        for step, ((loss, norm), (loss_ddp, norm_ddp)) in enumerate(
                zip(got[rank], want[rank // 2])):
            assert abs(loss - loss_ddp) <= 1e-5 * abs(loss_ddp), f"step {step}: {loss} vs {loss_ddp}"
            assert abs(norm - norm_ddp) <= 1e-5 * abs(norm_ddp), f"step {step}: {norm} vs {norm_ddp}"
    mine = transformers.LlamaForCausalLM.from_pretrained(got_out + ".model").state_dict()
    theirs = transformers.LlamaForCausalLM.from_pretrained(want_out + ".model").state_dict()
    assert set(mine) == set(theirs)
    for name, t in theirs.items():
        assert torch.allclose(mine[name], t, rtol=1e-5, atol=1e-6), name


# Rows of models.SEQ tokens (they split over a sequence's ranks), one micro-batch a step.
WHOLE_ROWS = {"ZS_TRAINER_ACCUMULATION": "1", "ZS_TRAINER_SP": "1"}


def logged_as_one_process(got, scratch):
    """Every rank of a sequence-split run logged the loss and grad norm one process logs
    on whole rows, every step (within 1e-5)."""
    if "whole-rows" not in _reference:
        _reference["whole-rows"] = trainer_run("ddp", scratch, tag="one-process",
                                               env=WHOLE_ROWS, world=1)[0]
    want = _reference["whole-rows"][0]
    for rank in range(WORLD):
        assert len(got[rank]) == STEPS
        for step, ((loss, norm), (loss_one, norm_one)) in enumerate(zip(got[rank], want)):
            assert abs(loss - loss_one) <= 1e-5 * abs(loss_one), f"step {step}: {loss} vs {loss_one}"
            assert abs(norm - norm_one) <= 1e-5 * abs(norm_one), f"step {step}: {norm} vs {norm_one}"


def test_trainer_with_sequence_parallelism_logs_one_process_losses(scratch):
    """TrainingArguments.parallelism_config = ParallelismConfig(sp_backend='deepspeed',
    sp_size=2) on 2 ranks at stage 3: each rank holds half of every row (Ulysses around the
    Llama's attention) and the two take each other's draws in turn, so with one micro-batch
    a step the Trainer logs what one process logs on whole rows, in the same order: each
    slice's loss weighted by its target tokens over the pair (within 1e-5)."""
    got, _ = trainer_run("zs", scratch, {"zero_optimization": {"stage": 3}}, tag="zs-sp",
                         env=dict(WHOLE_ROWS, ZS_TRAINER_SP="2"))
    logged_as_one_process(got, scratch)


def test_trainer_with_context_parallelism_logs_one_process_losses(scratch):
    """TrainingArguments.parallelism_config = ParallelismConfig(cp_size=2) on 2 ranks at
    stage 3: torch's ring attention over the pair, each holding torch's head-tail slices of
    every row (the Trainer's own context-parallel inputs: position ids, shifted labels); the
    Trainer's loss (its num_items_in_batch over the ranks that share a batch) and the engine's
    cp arithmetic log what one process logs on whole rows (within 1e-5): the losses and the
    gradient norms, with prompts of different lengths masked out."""
    got, _ = trainer_run("zs", scratch, {"zero_optimization": {"stage": 3}}, tag="zs-cp",
                         env=dict(WHOLE_ROWS, ZS_TRAINER_CP="2"))
    logged_as_one_process(got, scratch)


def test_trainer_checkpoints_resume_where_they_stopped(scratch):
    """save_strategy "steps" every 3 steps at stage 3; a new run resumed from
    checkpoint-3 (the engine's sharded state in checkpoint-3/zeroshard, the Trainer's
    scheduler, data position and RNG beside it) logs the uninterrupted run's last 3
    steps."""
    config = {"zero_optimization": {"stage": 3}}
    full, out = trainer_run("zs", scratch, config, tag="full", env={"ZS_TRAINER_SAVE_STEPS": "3"})
    ckpt = out + ".trainer/checkpoint-3"
    assert os.path.isfile(os.path.join(ckpt, "zeroshard", "latest")), os.listdir(ckpt)
    resumed, _ = trainer_run("zs", scratch, config, tag="resumed", env={"ZS_TRAINER_RESUME": ckpt})
    for rank in range(WORLD):
        assert len(resumed[rank]) == STEPS - 3
        for (loss, norm), (want, want_norm) in zip(resumed[rank], full[rank][3:]):
            assert abs(loss - want) <= 1e-6 * abs(want) and abs(norm - want_norm) <= 1e-5 * want_norm


@pytest.mark.parametrize("kept", ["checkpoint", "save_only_model"])
def test_load_best_model_at_end_loads_the_best_checkpoint(kept, scratch):
    """Evaluation and checkpoints every 2 steps, load_best_model_at_end with the highest
    eval loss as the best (the first, as the loss falls): the model saved at the end is
    DDP's, which is checkpoint-2's and not the last step's. A checkpoint holding the
    engine's state loads it; one of the model alone (save_only_model) is loaded into the
    whole parameters (the units of this small model are persistent: already whole)."""
    import transformers
    env = {"ZS_TRAINER_SAVE_STEPS": "2", "ZS_TRAINER_BEST": kept}
    _, want_out = trainer_run("ddp", scratch, tag=f"ddp-best-{kept}", env=env)
    _, got_out = trainer_run("zs", scratch, {"zero_optimization": {"stage": 3}},
                             tag=f"zs-best-{kept}", env=env)
    for out in (want_out, got_out):
        with open(out + ".best.json") as f:
            assert json.load(f) == "checkpoint-2"
    mine = transformers.LlamaForCausalLM.from_pretrained(got_out + ".model").state_dict()
    theirs = transformers.LlamaForCausalLM.from_pretrained(want_out + ".model").state_dict()
    last = transformers.LlamaForCausalLM.from_pretrained(
        want_out + ".trainer/checkpoint-6").state_dict()
    assert any(not torch.allclose(last[n], t, atol=1e-4) for n, t in theirs.items())
    for name, t in theirs.items():
        assert torch.allclose(mine[name], t, rtol=1e-5, atol=1e-6), name


def test_torch_compile_compiles_what_the_trainer_calls(scratch):
    """TrainingArguments.torch_compile: the loop calls the engine's module compiled
    (accelerate's prepare, which would compile it, is not used), with DDP's losses."""
    want, _ = ddp(scratch)
    got, out = trainer_run("zs", scratch, {"zero_optimization": {"stage": 3}}, tag="zs-compile",
                           env={"ZS_TRAINER_COMPILE": "1"})
    with open(out + ".wrapped.json") as f:
        assert json.load(f) == "OptimizedModule"
    for rank in range(WORLD):
        for step, ((loss, norm), (loss_ddp, norm_ddp)) in enumerate(zip(got[rank], want[rank])):
            assert abs(loss - loss_ddp) <= 1e-5 * abs(loss_ddp), f"step {step}: {loss} vs {loss_ddp}"
            assert abs(norm - norm_ddp) <= 1e-5 * abs(norm_ddp), f"step {step}: {norm} vs {norm_ddp}"


def test_config_values_that_contradict_training_arguments_are_refused(tmp_path):
    import transformers
    import zeroshard
    from zeroshard.integrations import trainer_config
    args = transformers.TrainingArguments(output_dir=str(tmp_path), gradient_accumulation_steps=2,
                                          per_device_train_batch_size=4, max_grad_norm=1.0,
                                          use_cpu=True, report_to=[])
    filled = trainer_config({"zero_optimization": {"stage": 3}, "gradient_clipping": "auto",
                             "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, args)
    assert filled["gradient_accumulation_steps"] == 2
    assert filled["train_micro_batch_size_per_gpu"] == 4
    assert filled["gradient_clipping"] == 1.0
    assert filled["optimizer"]["params"]["lr"] == args.learning_rate
    sgd = trainer_config({"optimizer": {"type": "SGD", "params": {"lr": "auto", "momentum": 0.9}}},
                         args)  # a torch.optim class takes its own arguments: only 'auto' filled
    assert sgd["optimizer"]["params"] == {"lr": args.learning_rate, "momentum": 0.9}
    with pytest.raises(zeroshard.Error, match="gradient_accumulation_steps is 4 but "
                       "TrainingArguments.gradient_accumulation_steps is 2"):
        trainer_config({"gradient_accumulation_steps": 4}, args)
    with pytest.raises(zeroshard.Error, match="a 'scheduler' section is not allowed with the Trainer"):
        trainer_config({"scheduler": {"type": "WarmupLR"}}, args)
    from accelerate import ParallelismConfig
    from zeroshard.integrations import ZeroShardTrainer
    tensor = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                            parallelism_config=ParallelismConfig(tp_size=2))
    with pytest.raises(zeroshard.Error, match=r"ZeroShardTrainer: parallelism_config \(tp_size=2\): "
                       "zeroshard shards over the data-parallel ranks itself"):
        ZeroShardTrainer(model=torch.nn.Linear(2, 2), args=tensor)
