"""engine.memory_report() from Python: beside the ledger's tiers and kinds, the device
tier says the capacity the plan was made for (on the host: the machine's RAM shared by
the local ranks, here MemTotal read from /proc/meminfo), and the CUDA caching
allocator's counts only where the model is on a GPU."""
import json

from test_errors import run_one


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
