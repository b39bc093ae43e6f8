"""initialize()'s optimizer contract on real ranks: parameter groups from model_parameters,
a client torch optimizer and LR scheduler, each equal to torch's own run of the same
optimizer under DDP (20 steps, 2 ranks, within 1e-5); and every way to get it wrong ends
in an error that names what was wrong."""
import json

import pytest

from conftest import (EQUIVALENCE_STEPS as STEPS, EQUIVALENCE_WORLD as WORLD, TRAIN_WORKER as WORKER,
                      assert_same, both_legs, main_leg_only, run_ranks, run_snippet as run_one,
                      with_reference_optimizer)


_reference = {}


def both(how, zero, scratch, model="gpt"):
    """(DDP's losses, zeroshard's) with the optimizer set up as `how` says."""
    env = {"ZS_TEST_OPTIMIZER": how}
    config = with_reference_optimizer({"zero_optimization": zero}, scratch / "nvme")
    (scratch / "nvme").mkdir(exist_ok=True)
    if (how, model) not in _reference:  # the same for every stage and offload
        out = str(scratch / f"ddp-{how}")
        _reference[how, model] = run_ranks([WORKER, "ddp", model, str(STEPS), out], WORLD, out,
                                           extra_env=env)
    out = str(scratch / f"zs-{how}")
    got = run_ranks([WORKER, "zs", model, str(STEPS), out, json.dumps(config)], WORLD, out,
                    extra_env=env)
    return _reference[how, model], got


@pytest.mark.parametrize("stage", [0, 1, 2, both_legs(3)])
def test_groups_with_and_without_decay_equal_torch_adamw(stage, scratch):
    want, got = both("groups", {"stage": stage}, scratch)
    assert_same(got, want)
    if stage != 0:
        return
    plain = run_ranks([WORKER, "ddp", "gpt", str(STEPS), str(scratch / "plain")], WORLD,
                      str(scratch / "plain"))
    assert abs(plain[0][-1] - want[0][-1]) > 1e-4  # the groups changed the training


@pytest.mark.parametrize("offload", ["cpu", both_legs("nvme")])
def test_groups_with_offloaded_optimizer(offload, scratch):
    """Spans of the groups cut across NVMe sub-groups (sub_group_size 1000)."""
    zero = {"stage": 3, "offload_optimizer": {"device": offload}}
    want, got = both("groups", zero, scratch)
    assert_same(got, want)


@pytest.mark.parametrize("stage", [2, both_legs(3)])
def test_client_adamw_and_callable_scheduler_equal_their_own_run(stage, scratch):
    want, got = both("client", {"stage": stage}, scratch)
    assert_same(got, want)


def test_client_adam_with_l2_decay_and_its_step_lr(scratch):
    want, got = both("client_adam", {"stage": 1}, scratch, model="hf")
    assert_same(got, want)


GROUPS = """
decay = [model[0].weight]
rest = [model[0].bias]
"""


def test_lr_set_in_param_groups_takes_effect():
    code, out = run_one(GROUPS + """
engine, opt, _, _ = zeroshard.initialize(model=model, config={}, model_parameters=[
    {'params': decay}, {'params': rest, 'lr': 0.5, 'weight_decay': 0.0}])
assert [g['lr'] for g in opt.param_groups] == [1e-3, 0.5], opt.param_groups
opt.param_groups[1]['lr'] = 0.0
bias = model[0].bias.detach().clone(); weight = model[0].weight.detach().clone()
loss = engine(torch.ones(2, 4)).square().sum(); engine.backward(loss); engine.step()
assert torch.equal(model[0].bias, bias), 'lr 0 still moved the bias'
assert not torch.equal(model[0].weight, weight)
print('OK', engine.get_lr())
""")
    assert code == 0 and "OK [0.001, 0.0]" in out, out


def test_config_scheduler_sets_every_group_lr():
    code, out = run_one(GROUPS + """
config = {'scheduler': {'type': 'WarmupLR', 'params': {'warmup_min_lr': 0.0,
          'warmup_max_lr': 0.1, 'warmup_num_steps': 4, 'warmup_type': 'linear'}}}
engine, opt, _, sched = zeroshard.initialize(model=model, config=config, model_parameters=[
    {'params': decay}, {'params': rest, 'lr': 0.5}])
for _ in range(2):
    loss = engine(torch.ones(2, 4)).square().sum(); engine.backward(loss); engine.step()
print('LR', [g['lr'] for g in opt.param_groups], sched.get_last_lr())
""")
    # DeepSpeed's step index: after 2 steps the next lr is iteration 1's, 0.1 x 1/4.
    assert code == 0 and "LR [0.025, 0.025] [0.025, 0.025]" in out, out


REFUSALS = [
    ("model_parameters=[{'params': decay + rest}, {'params': rest}]",
     "parameter '0.bias' is in param_groups[0] and param_groups[1]"),
    ("model_parameters=[{'params': decay}]",
     "1 trainable parameter(s) are in no parameter group: 0.bias"),
    ("model_parameters=[{'params': decay, 'lr': -1.0}, {'params': rest}]",
     "param_groups[0].lr: -1 is not allowed; allowed: >= 0"),
    ("model_parameters=[{'params': decay, 'momentum': 0.9}, {'params': rest}]",
     "model_parameters[0]: key 'momentum' belongs to another optimizer"),
    ("model_parameters=[{'params': decay}, rest[0]]", "model_parameters: a mix of"),
    ("optimizer=torch.optim.LBFGS(model.parameters())",
     "optimizer: torch.optim.lbfgs.LBFGS steps with a closure over whole parameters, which a "
     "shard does not hold; allowed: an optimizer whose update is elementwise"),
    ("optimizer=torch.optim.AdamW(model.parameters(), differentiable=True)",
     "optimizer: AdamW(differentiable=True) is not supported; allowed: differentiable=False"),
    ("optimizer=torch.optim.AdamW(model.parameters()), model_parameters=decay",
     "model_parameters and optimizer name different parameters"),
    ("optimizer=torch.optim.AdamW(model.parameters()), "
     "lr_scheduler=torch.optim.lr_scheduler.StepLR(torch.optim.AdamW(model.parameters()), 1)",
     "lr_scheduler: it is bound to an optimizer that initialize() was not given"),
    ("optimizer=torch.optim.AdamW(model.parameters()), config={'optimizer': {'type': 'AdamW'}}",
     "optimizer: given to initialize() and as 'optimizer' in config dict; one of them must go"),
    ("lr_scheduler=lambda o: None, config={'scheduler': {'type': 'WarmupLR'}}",
     "lr_scheduler: given to initialize() and as 'scheduler' in config dict"),
    ("mpu=object()", "mpu: a object without get_tensor_model_parallel_world_size/_rank"),
    ("config_params={}", "config and config_params are both given"),
    ("distributed_port=1", "distributed_port=1, but the launcher set MASTER_PORT="),
    ("no_such_argument=1", "got an unexpected keyword argument 'no_such_argument'"),
]


@main_leg_only
def test_initialize_refuses_with_the_reason():
    """Every case in one process (importing torch once): each must raise, naming why."""
    cases = "\n".join(
        f"try:\n    zeroshard.initialize(**dict(dict(model=model, config={{}}), **dict({body})))\n"
        f"    print('CASE {i}: no error')\n"
        f"except (zeroshard.Error, TypeError) as e:\n    print('CASE {i}:', e)"
        for i, (body, _) in enumerate(REFUSALS))
    code, out = run_one(GROUPS + cases)
    assert code == 0, out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if line.startswith("CASE")}
    for i, (body, message) in enumerate(REFUSALS):
        assert message in lines.get(f"CASE {i}", ""), f"{body}: {lines.get(f'CASE {i}')}"


def test_resume_goes_on_with_the_client_scheduler_and_the_groups(scratch):
    """Saved after 8 steps and resumed in new processes: the client LambdaLR goes on from
    step 8 (its state is in the checkpoint, as DeepSpeed keeps it), and each group its
    own lr, so every later loss is the uninterrupted run's. Without the scheduler's
    state the resumed run would restart it at lr 1e-2 (step 0's) instead of 2.9e-3."""
    zero = {"stage": 3}
    _, straight = both("client", zero, scratch)
    config = json.dumps(with_reference_optimizer({"zero_optimization": zero}, scratch / "nvme"))
    ckpt = str(scratch / "ckpt")
    env = {"ZS_TEST_OPTIMIZER": "client", "ZS_CKPT_DIR": ckpt, "ZS_CKPT_SAVE_AT": "8",
           "ZS_CKPT_STOP": "1"}
    out = str(scratch / "first")
    run_ranks([WORKER, "zs", "gpt", str(STEPS), out, config], WORLD, out, extra_env=env)
    env = {"ZS_TEST_OPTIMIZER": "client", "ZS_CKPT_LOAD": ckpt}
    out = str(scratch / "resumed")
    resumed = run_ranks([WORKER, "zs", "gpt", str(STEPS), out, config], WORLD, out, extra_env=env)
    for rank in range(WORLD):
        assert resumed[rank] == straight[rank][8:], f"rank {rank}"


@main_leg_only
def test_a_checkpoint_with_other_groups_is_refused_before_anything_changes(scratch):
    config = json.dumps(with_reference_optimizer({"zero_optimization": {"stage": 2}},
                                                 scratch / "nvme"))
    ckpt = str(scratch / "ckpt")
    out = str(scratch / "groups")
    run_ranks([WORKER, "zs", "gpt", "2", out, config], WORLD, out,
              extra_env={"ZS_TEST_OPTIMIZER": "groups", "ZS_CKPT_DIR": ckpt,
                         "ZS_CKPT_SAVE_AT": "1", "ZS_CKPT_STOP": "1"})
    out = str(scratch / "one")
    results = run_ranks([WORKER, "zs", "gpt", "2", out, config], WORLD, out, expect_ok=False,
                        extra_env={"ZS_CKPT_LOAD": ckpt})
    for code, log in results:
        assert code != 0
        assert "holds 2 optimizer parameter group(s), this engine has 1" in log, log[-2000:]
