"""engine.memory_report() from Python: beside the ledger's tiers and kinds, the device
tier says the capacity the plan was made for (on the host: the machine's RAM shared by
the local ranks, here MemTotal read from /proc/meminfo), and the CUDA caching
allocator's counts only where the model is on a GPU."""
import json

from conftest import run_snippet as run_one


def mem_total():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))


def test_the_device_tier_says_its_capacity_and_has_no_allocator_on_the_host():
    code, out = run_one(
        "import json\n"
        "engine, *_ = zeroshard.initialize(model=model, config={'zero_optimization': {'stage': 2}})\n"
        "engine.backward(engine(torch.ones(2, 4)).sum())\nengine.step()\n"
        "d = engine.memory_report()['device']\n"
        "print('REPORT', json.dumps({'capacity': d['capacity'], 'allocator': 'allocator' in d,"
        " 'kinds': sorted(d['kinds'])}))")
    assert code == 0, out
    report = json.loads(out.split("REPORT ", 1)[1].splitlines()[0])
    assert report["capacity"] == mem_total()
    assert report["allocator"] is False
    assert "params" in report["kinds"] and "optimizer_states" in report["kinds"], report


def test_stage3_counts_and_plans_a_frozen_unit_without_gradients_or_optimizer_state():
    """A model half frozen (as a LoRA base is): at stage 3 its frozen block is sharded as
    the trainable one is, and holds no optimizer state or fp32 gradient; the Planner's
    prediction for the live model says the same, kind by kind."""
    code, out = run_one(
        "import json\n"
        "m = torch.nn.Module()\n"
        "m.blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(2))\n"
        "m.blocks[0].requires_grad_(False)\n"
        "m.forward = lambda x: m.blocks[1](m.blocks[0](x)).sum()\n"
        "engine, *_ = zeroshard.initialize(model=m, config={'zero_optimization': {'stage': 3}})\n"
        "engine.backward(engine(torch.ones(2, 64))); engine.step()\n"
        "k = engine.memory_report()['device']['kinds']\n"
        "print('REPORT', json.dumps({n: [k[n]['current'], k[n]['predicted']] for n in k}))")
    assert code == 0, out
    kinds = json.loads(out.split("REPORT ", 1)[1].splitlines()[0])
    unit = 4 * (64 * 64 + 64)  # fp32, one rank: 4,160 elements, a multiple of 64
    assert kinds["params"] == [2 * unit, 2 * unit]  # both blocks
    assert kinds["optimizer_states"] == [2 * unit, 2 * unit]  # Adam's m and v: one block
    assert kinds["grads_fp32"] == [unit, unit]
