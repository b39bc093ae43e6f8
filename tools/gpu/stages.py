#!/usr/bin/env python3
"""./zs gpu-check's stages, ranked by risk and run within one budget of time.

A GPU machine is lent for minutes, so the check runs first what has changed most since it
last passed on a GPU, each stage under its own limit, and starts a stage only while the
budget left still holds that stage's whole limit: a run ends within its budget and says
which stages it reached. Three steps:

  plan PACKDIR     here (./zs gpu-pack): each stage's risk, the lines changed under its
                   paths since the commit it last passed on (docs/gpu.md's record; never
                   passed: every line under them, and ranked first), highest first, into
                   PACKDIR/stages.json; the ranking needs git, which that machine lacks
  run OUT          there (./zs gpu-check): the stages in that order (the registry's order
                   where no plan was carried), within ZS_GPU_BUDGET seconds (540), up to
                   ZS_GPU_SLOTS side by side (3; a stage marked alone runs with no other);
                   OUT/summary.txt a line a stage, OUT/NAME.log each one's output,
                   OUT/passed.json what passed, on which commit and device
  record OUT       here, after a run: the stages that passed into docs/gpu.md's record

ZS_GPU_STAGES picks stages: "all" (the default: every stage but those marked on_request),
or stage names and groups separated by commas (tests: the GPU tests; checks: syncs,
memcheck, build-there; benches: bench gpu and bench inference; search).
A stage's command is a shell function tools/zs/gpu.sh exports."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORD = os.path.join(ROOT, "docs", "gpu.md")
BEGIN, END = "<!-- gpu stages: begin -->", "<!-- gpu stages: end -->"
CPP = ["cuda", "engine", "sharding", "optim", "offload", "common", "include", "plan", "config"]
PY = "bindings/zeroshard/"


@dataclass(frozen=True)
class Stage:
    name: str
    seconds: int  # its own limit
    command: str  # a function tools/zs/gpu.sh exports, with its arguments
    paths: tuple  # what it runs: a change there makes it riskier
    group: str = "tests"
    alone: bool = False  # it times something: nothing else runs beside it
    on_request: bool = False  # only when ZS_GPU_STAGES names it


STAGES = [
    Stage("gtests", 150, "gpu_gtests", tuple(CPP) + ("tests/engine",)),
    Stage("streams", 150, "gpu_pytests test_gpu_streams.py",
          tuple(CPP) + (PY + "_engine", "tests/python/test_gpu_streams.py")),
    Stage("resume", 120, "gpu_pytests test_gpu_resume.py",
          ("engine", "sharding", PY + "_checkpoint", "tests/python/test_gpu_resume.py")),
    Stage("tensor-parallel", 150, "gpu_pytests test_gpu_paths.py -k tensor_parallel",
          (PY + "_parallel/tensor_parallel.py", PY + "_parallel/hf_tensor_parallel.py",
           PY + "_parallel/dtensor.py", "tests/python/tp_worker.py")),
    Stage("pipeline", 180, "gpu_pytests test_gpu_paths.py -k pipeline",
          (PY + "_parallel/pipelining.py", PY + "_parallel/pipe_module.py",
           PY + "_parallel/pipe_topology.py", PY + "_engine/pipe_engine.py",
           "tests/python/pp_worker.py")),
    Stage("inference", 150, "gpu_pytests test_gpu_paths.py -k inference",
          (PY + "inference", "sharding/ShardQuantizer.cpp", "tests/python/inference_worker.py")),
    Stage("front-ends", 180, "gpu_pytests test_gpu_paths.py -k front_end",
          (PY + "integrations", "tests/python/trainer_worker.py",
           "tests/python/accelerate_worker.py", "tests/python/lightning_worker.py")),
    Stage("experts", 180, "gpu_pytests test_gpu_paths.py -k experts",
          (PY + "_experts", "engine/Communicators.cpp", "tests/python/moe_ep_script.py")),
    Stage("sequence", 150, "gpu_pytests test_gpu_paths.py -k sequence",
          (PY + "_sequence", "tests/python/sequence_worker.py")),
    Stage("activations", 150, "gpu_pytests test_gpu_paths.py -k activation_offload",
          (PY + "_activations", "offload/ActivationStore.cpp",
           "tests/python/activation_offload_worker.py")),
    Stage("syncs", 120, "gpu_syncs", ("engine", "sharding", "optim", "tools/gpu/sync_count.py"),
          group="checks"),
    Stage("memcheck", 250, "gpu_memcheck", ("cuda", "engine", "sharding", "optim"),
          group="checks"),
    Stage("build-there", 170, "gpu_build_niced build-gpu",
          ("CMakeLists.txt", "cmake", "tools/zs/gpu.sh"), group="checks"),
    Stage("bench", 290, "gpu_bench", tuple(CPP) + (PY, "tools/bench/gpu_bench.py"),
          group="benches", alone=True),
    Stage("bench-inference", 200, "gpu_bench_inference",
          (PY + "inference", "offload", "tools/bench/inference_bench.py"),
          group="benches", alone=True, on_request=True),
    Stage("search", 570, "gpu_search", ("tools/bench/gpu_bench.py", "plan", PY + "_engine"),
          group="search", alone=True, on_request=True),
]
BY_NAME = {stage.name: stage for stage in STAGES}


def chosen(spec):
    """The stages ZS_GPU_STAGES names, in the registry's order; unknown names refused."""
    if spec in ("", "all"):
        return [s for s in STAGES if not s.on_request]
    names = [n.strip() for n in spec.split(",") if n.strip()]
    groups = {s.group for s in STAGES}
    unknown = [n for n in names if n not in BY_NAME and n not in groups]
    if unknown:
        raise SystemExit(f"ZS_GPU_STAGES names {', '.join(unknown)}: allowed are all, the "
                         f"groups {', '.join(sorted(groups))} and the stages "
                         f"{', '.join(BY_NAME)}")
    return [s for s in STAGES if s.name in names or s.group in names]


# --- the record: docs/gpu.md's table of the commit each stage last passed on -------------
def read_record(text):
    """{stage: (commit, date, device)} from the table between the record's markers."""
    if BEGIN not in text:
        return {}
    table = text.split(BEGIN, 1)[1].split(END, 1)[0]
    record = {}
    for line in table.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] in BY_NAME:
            record[cells[0]] = tuple(cells[1:4])
    return record


def write_record(text, record):
    rows = ["| stage | last passed on | date | device | limit |",
            "| --- | --- | --- | --- | --- |"]
    for stage in STAGES:
        commit, date, device = record.get(stage.name, ("never", "", ""))
        rows.append(f"| {stage.name} | {commit} | {date} | {device} | {stage.seconds} s |")
    table = "\n".join(rows)
    if BEGIN not in text:
        raise SystemExit(f"{RECORD} has no '{BEGIN}' ... '{END}' section to record into")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}"


# --- plan: here, with git ----------------------------------------------------------------
def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)


def lines_changed(since, paths):
    """Lines added and removed under PATHS from SINCE to the working tree (None: since the
    beginning, every line under them); None where SINCE is not in this history."""
    base = since or git("hash-object", "-t", "tree", "/dev/null").stdout.strip()
    if since and git("cat-file", "-e", f"{since}^{{commit}}").returncode != 0:
        return None
    out = git("diff", "--numstat", base, "--", *paths)
    if out.returncode != 0:
        return None
    total = 0
    for line in out.stdout.splitlines():
        added, removed = line.split("\t")[:2]
        total += int(added) + int(removed) if added != "-" else 1
    return total


def plan(pack_dir):
    with open(RECORD) as f:
        record = read_record(f.read())
    ranked = []
    for stage in STAGES:
        since = record.get(stage.name, ("never",))[0]
        since = None if since == "never" else since
        lines = lines_changed(since, stage.paths)
        if lines is None:  # (a commit this history lacks: as if never passed)
            since, lines = None, lines_changed(None, stage.paths)
        ranked.append({"name": stage.name, "since": since or "never", "lines": lines})
    # Never passed first, then the most lines changed since the last pass.
    ranked.sort(key=lambda r: (r["since"] != "never", -r["lines"]))
    os.makedirs(pack_dir, exist_ok=True)
    with open(os.path.join(pack_dir, "stages.json"), "w") as f:
        json.dump(ranked, f, indent=1)
    for r in ranked:
        print(f"  {r['name']:<16} {r['lines']:>7} lines changed since {r['since']}")
    return ranked


# --- run: there --------------------------------------------------------------------------
def ordered(stages, plan_file):
    """STAGES in the carried plan's order; stages the plan lacks after, in the registry's."""
    if not os.path.exists(plan_file):
        return stages, {}
    with open(plan_file) as f:
        ranked = json.load(f)
    rank = {r["name"]: i for i, r in enumerate(ranked)}
    return sorted(stages, key=lambda s: rank.get(s.name, len(rank))), \
        {r["name"]: r for r in ranked}


class Running:
    def __init__(self, stage, out):
        self.stage, self.start = stage, time.monotonic()
        self.log = open(os.path.join(out, f"{stage.name}.log"), "w")
        self.proc = subprocess.Popen(["bash", "-c", stage.command], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def seconds(self):
        return time.monotonic() - self.start

    def stop(self):
        """Its whole process group: the stage's own children (ranks, servers) too."""
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def schedule(stages, budget, slots, out, say=print):
    """Start each stage in order while the budget left holds its whole limit and a slot is
    free (an alone stage: once nothing runs, and nothing beside it); a stage that no longer
    fits is passed over for the next that does. Returns {name: (status, seconds)}."""
    start, pending, running, results = time.monotonic(), list(stages), [], {}
    while pending or running:
        left = budget - (time.monotonic() - start)
        for stage in list(pending):
            if stage.seconds > left:
                pending.remove(stage)
                results[stage.name] = (f"not run: needs {stage.seconds} s, {int(left)} s left", 0)
                continue
            if any(r.stage.alone for r in running):
                break
            if stage.alone and running:
                break  # (the stages after it wait too: the ranking is kept)
            if len(running) >= slots:
                break
            pending.remove(stage)
            say(f"== {stage.name} (at most {stage.seconds} s, {int(left)} s of the budget left)")
            running.append(Running(stage, out))
            if stage.alone:
                break
        time.sleep(0.2)
        for r in list(running):
            code = r.proc.poll()
            if code is None and r.seconds() > r.stage.seconds:
                r.stop()
                code = "timed out"
            if code is None:
                continue
            running.remove(r)
            r.log.close()
            status = "ok" if code == 0 else (code if isinstance(code, str) else f"exit {code}")
            results[r.stage.name] = (status, int(r.seconds()))
            say(f"   {r.stage.name}: {status} in {int(r.seconds())} s")
    return results


def built_commit():
    built = os.path.join(os.environ.get("GPU_DIR", os.path.join(ROOT, ".gpu")), "prebuilt",
                         "BUILT")
    if os.path.exists(built):
        with open(built) as f:
            found = re.search(r"^commit=(\S+)", f.read(), re.M)
            if found:
                return found.group(1)
    return "unknown"


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True)
    except FileNotFoundError:
        return "no GPU (no nvidia-smi)"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else "no GPU"


def run(out):
    budget = int(os.environ.get("ZS_GPU_BUDGET", "540"))
    slots = int(os.environ.get("ZS_GPU_SLOTS", "3"))
    pack = os.environ.get("GPU_DIR", os.path.join(ROOT, ".gpu"))
    stages, ranked = ordered(chosen(os.environ.get("ZS_GPU_STAGES", "all")),
                             os.path.join(pack, "stages.json"))
    print(f"== {len(stages)} stages by risk, {budget} s: " + ", ".join(s.name for s in stages))
    results = schedule(stages, budget, slots, out)
    commit, device = built_commit(), device_name()
    passed = {name: {"commit": commit, "date": time.strftime("%Y-%m-%d"), "device": device}
              for name, (status, _) in results.items() if status == "ok"}
    with open(os.path.join(out, "passed.json"), "w") as f:
        json.dump(passed, f, indent=1)
    with open(os.path.join(out, "summary.txt"), "a") as f:
        for stage in stages:
            status, seconds = results[stage.name]
            lines = ranked.get(stage.name, {}).get("lines", "?")
            f.write(f"{stage.name:<16} {status:<10} {seconds:4d} s  (risk: {lines} lines)\n")
        left = [s.name for s in stages if results[s.name][0].startswith("not run")]
        f.write(f"reached {len(stages) - len(left)} of {len(stages)} stages in {budget} s; "
                f"{len(passed)} passed on {commit} ({device})\n")
        if left:  # the next command's
            f.write(f"not reached: ZS_GPU_STAGES={','.join(left)}\n")
    return 0 if len(passed) == len(stages) else 1


def record(out):
    with open(os.path.join(out, "passed.json")) as f:
        passed = json.load(f)
    with open(RECORD) as f:
        text = f.read()
    entries = read_record(text)
    for name, p in passed.items():
        if name not in BY_NAME:
            raise SystemExit(f"{out}/passed.json names a stage '{name}' the registry lacks")
        if p["device"].startswith("no GPU"):  # (its GPU tests skipped, or ran on the CPU)
            raise SystemExit(f"{out}/passed.json: '{name}' passed on {p['device']}; only a "
                             "run on a GPU is recorded")
        entries[name] = (p["commit"], p["date"], p["device"])
    tmp = RECORD + ".tmp"
    with open(tmp, "w") as f:
        f.write(write_record(text, entries))
    os.replace(tmp, RECORD)
    print(f"docs/gpu.md: {len(passed)} stages recorded ({', '.join(passed) or 'none'})")


def main(argv):
    commands = {"plan": plan, "run": run, "record": record}
    if len(argv) != 2 or argv[0] not in commands:
        raise SystemExit("usage: stages.py plan PACKDIR | run OUT | record OUT")
    return commands[argv[0]](argv[1])


if __name__ == "__main__":
    result = main(sys.argv[1:])
    sys.exit(result if isinstance(result, int) else 0)
