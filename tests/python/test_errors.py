"""Bad use of the Python API ends in a clear error that names what was wrong."""
import time

from conftest import HERE, main_leg_only, run_ranks, run_snippet as run_one


@main_leg_only
def test_unknown_config_key_is_named_with_a_suggestion():
    code, out = run_one("zeroshard.initialize(model=model, config={'zero_optimisation': {'stage': 2}})")
    assert code != 0
    assert "zeroshard._zeroshard.Error" in out and "zero_optimisation" in out
    assert "did you mean 'zero_optimization'" in out


@main_leg_only
def test_missing_config_file():
    code, out = run_one("zeroshard.initialize(model=model, config='no/such.yaml')")
    assert code != 0 and "config file 'no/such.yaml' does not exist" in out


@main_leg_only
def test_step_before_backward():
    code, out = run_one(
        "engine, *_ = zeroshard.initialize(model=model, config={'zero_optimization': {'stage': 1}})\n"
        "engine(torch.ones(2, 4))\nengine.step()")
    assert code != 0 and "engine.step() called before engine.backward(loss)" in out


@main_leg_only
def test_save_pretrained_of_a_model_that_is_not_hugging_faces():
    code, out = run_one(
        "engine, *_ = zeroshard.initialize(model=model, config={'zero_optimization': {'stage': 3}})\n"
        "engine.save_pretrained('out')")
    assert code != 0
    assert "save_pretrained: the model is a Sequential, which has no save_pretrained" in out
    assert "format='safetensors'" in out


@main_leg_only
def test_no_process_group_environment():
    code, out = run_one("zeroshard.initialize(model=model, config={})", launched=False)
    assert code != 0 and "no process-group environment" in out and "torchrun" in out


@main_leg_only
def test_bad_value_names_key_value_and_what_is_allowed():
    code, out = run_one(
        "zeroshard.initialize(model=model, config={'zero_optimization': {'stage': 7}})")
    assert code != 0 and "stage" in out and "7" in out and "allowed" in out


@main_leg_only
def test_estimate_counts_tied_parameters_once():
    code, out = run_one(
        "m = torch.nn.Module()\nm.emb = torch.nn.Embedding(10, 4)\n"
        "m.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))\n"
        "m.head = torch.nn.Linear(4, 10, bias=False)\nm.head.weight = m.emb.weight\n"
        "plan = zeroshard.estimate(m, gpus_per_node=2, gpu_memory='1GB')\n"
        "print('total', sum(p.numel() for p in set(m.parameters())))\n"
        "print(plan['recommended'], plan['fits'])")
    assert code == 0, out
    assert "total 80" in out  # 40 (tied) + 2 x 20
    assert "stage 0 True" in out


def test_a_stage3_parameter_read_between_steps_is_whole_and_a_write_is_refused():
    """Between steps a stage-3 parameter holds no values of its own: a read gathers its
    unit (the values gathered_parameters shows, copied: the unit goes at the next read),
    printing it says it is sharded instead of gathering, and a write outside
    gathered_parameters raises, naming the parameter and the way to write it."""
    code, out = run_one(
        "m = torch.nn.Module()\n"
        "m.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))\n"
        "m.forward = lambda x: m.blocks[1](m.blocks[0](x)).sum()\n"
        "engine, *_ = zeroshard.initialize(model=m, config={'zero_optimization': {'stage': 3}})\n"
        "engine.backward(engine(torch.ones(2, 4))); engine.step()\n"
        "w = m.blocks[0].weight\n"
        "print('repr:', repr(w))\n"
        "read = w.detach()\n"
        "other = m.blocks[1].weight * 1\n"  # another unit: the first one goes
        "print('finite', bool(read.isfinite().all()), 'norm', float(read.norm()) > 0)\n"
        "with engine.gathered_parameters(m.blocks[0]):\n"
        "    print('same', torch.equal(read, w.detach()))\n"
        "try:\n"
        "    with torch.no_grad(): w.add_(1)\n"
        "except zeroshard.Error as e:\n"
        "    print('write refused:', e)\n"
        "print('unchanged', torch.equal(read, w.detach()))\n")
    assert code == 0, out
    assert "repr: Parameter 'blocks.0.weight' of shape (4, 4), torch.float32, sharded" in out
    assert "finite True norm True" in out
    assert "same True" in out
    assert ("write refused: parameter 'blocks.0.weight' is sharded (ZeRO stage 3) and add_ "
            "would write it outside training") in out
    assert "gathered_parameters(module, modifier_rank=0)" in out
    assert "unchanged True" in out


def test_a_parameter_read_between_steps_by_one_rank_alone_stops_both_with_a_message(scratch):
    """Reading a stage-3 parameter between steps gathers it from every rank. Rank 0 reading
    one alone waits on a group of its own for that gather, so it never pairs with the
    other rank's next gathers (which would hand both wrong values): after
    comm_timeout_seconds each stops, rank 0 saying what every rank must do."""
    code = (
        "import sys, torch, zeroshard\n"
        f"sys.path.insert(0, {HERE!r}); import models\n"
        "model = models.make('gpt')\n"
        "engine, *_ = zeroshard.initialize(model=model, config={'zero_optimization': "
        "{'stage': 3}, 'comm_timeout_seconds': 5})\n"
        "tokens = models.batch(0, engine.rank, engine.world_size)\n"
        "engine.backward(engine(tokens)); engine.step()\n"
        "if engine.rank == 0:\n"
        "    print(float(model.ln_f.weight.sum()))\n"
        "engine.backward(engine(tokens)); engine.step()\n")
    start = time.monotonic()
    out = str(scratch / "alone")
    ranks = run_ranks(["-c", code], 2, out, timeout=120, expect_ok=False)
    assert time.monotonic() - start < 100
    assert all(status != 0 for status, _ in ranks), ranks
    assert ("a stage-3 parameter read outside forward and backward is gathered by every rank "
            "together") in ranks[0][1], ranks[0][1][-2000:]
