"""./zs gpu-check's scheduling (tools/gpu/stages.py), run here with stand-in stages: the
budget decides which stages start, a stage over its own limit is stopped with its
children, a stage marked alone runs with nothing beside it, the ranking puts stages never
passed first and then the most lines changed, and the record round-trips docs/gpu.md."""
import os
import sys
import time

import pytest

from conftest import ROOT, main_leg_only

sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))
import stages  # noqa: E402

pytestmark = main_leg_only


def stage(name, seconds, command, alone=False):
    return stages.Stage(name, seconds, command, ("tools",), alone=alone)


def test_a_stage_whose_limit_the_budget_left_cannot_hold_is_not_started(tmp_path):
    never = tmp_path / "never"
    ran = [stage("first", 2, "true"), stage("too-long", 30, f"touch {never}"),
           stage("fits", 2, "true")]
    results = stages.schedule(ran, budget=5, slots=1, out=str(tmp_path), say=lambda s: None)
    assert results["first"][0] == results["fits"][0] == "ok"
    assert results["too-long"][0].startswith("not run: needs 30 s, ")
    assert not never.exists()


def test_a_stage_over_its_limit_is_stopped_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    hang = stage("hang", 1, f"sleep 60 & echo $! > {pid_file}; wait")
    start = time.monotonic()
    results = stages.schedule([hang, stage("after", 2, "exit 3")], budget=20, slots=1,
                              out=str(tmp_path), say=lambda s: None)
    assert time.monotonic() - start < 8
    assert results["hang"][0] == "timed out" and results["after"][0] == "exit 3"
    assert not running(int(pid_file.read_text()))  # the stage's own child went with it


def running(pid):
    """True while `pid` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_alone_stage_runs_with_nothing_beside_it(tmp_path):
    def span(name, alone=False):
        marks = tmp_path / name
        return stage(name, 5, f"date +%s.%N > {marks}; sleep 0.5; date +%s.%N >> {marks}",
                     alone)
    order = [span("a"), span("b"), span("timed", alone=True), span("c")]
    stages.schedule(order, budget=30, slots=3, out=str(tmp_path), say=lambda s: None)
    spans = {s.name: [float(t) for t in (tmp_path / s.name).read_text().split()]
             for s in order}
    t0, t1 = spans["timed"]
    for other in ("a", "b", "c"):
        begin, end = spans[other]
        assert end <= t0 or begin >= t1, f"{other} ran beside the alone stage"
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1]  # side by side
    assert spans["c"][0] >= t1  # after it: the ranking kept


def test_the_ranking_puts_never_passed_stages_first_then_the_most_lines_changed(
        tmp_path, monkeypatch):
    record = tmp_path / "gpu.md"
    head = stages.git("rev-parse", "HEAD").stdout.strip()
    table = {s.name: (head, "2026-12-07", "test GPU") for s in stages.STAGES}
    del table["pipeline"]  # never passed
    table["gtests"] = ("0" * 40, "2026-11-01", "test GPU")  # a commit this history lacks
    record.write_text(stages.write_record(f"x\n{stages.BEGIN}\n{stages.END}\ny\n", table))
    monkeypatch.setattr(stages, "RECORD", str(record))
    ranked = stages.plan(str(tmp_path / "pack"))
    assert {r["name"] for r in ranked[:2]} == {"pipeline", "gtests"}
    assert ranked[0]["since"] == ranked[1]["since"] == "never"
    assert ranked[0]["lines"] >= ranked[1]["lines"] > 0
    # The rest passed on HEAD: lines changed are only this tree's uncommitted ones.
    passed = ranked[2:]
    assert all(r["since"] == head for r in passed)
    assert [r["lines"] for r in passed] == sorted((r["lines"] for r in passed), reverse=True)
    carried, _ = stages.ordered(list(reversed(stages.STAGES)),
                                str(tmp_path / "pack" / "stages.json"))
    assert [s.name for s in carried] == [r["name"] for r in ranked]


def test_the_record_keeps_each_stages_last_pass_and_names_refused(tmp_path, monkeypatch):
    record = tmp_path / "gpu.md"
    record.write_text(f"intro\n{stages.BEGIN}\n{stages.END}\noutro\n")
    monkeypatch.setattr(stages, "RECORD", str(record))
    out = tmp_path / "out"
    out.mkdir()
    (out / "passed.json").write_text(
        '{"gtests": {"commit": "abc1234", "date": "2026-12-07", "device": "NVIDIA H100"}}')
    stages.record(str(out))
    text = record.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n")
    got = stages.read_record(text)
    assert got["gtests"] == ("abc1234", "2026-12-07", "NVIDIA H100")
    assert got["pipeline"] == ("never", "", "")
    (out / "passed.json").write_text('{"streams": {"commit": "abc1234", "date": "2026-12-07", '
                                     '"device": "no GPU (no nvidia-smi)"}}')
    with pytest.raises(SystemExit, match="'streams' passed on no GPU .*only a run on a GPU is"):
        stages.record(str(out))
    assert stages.read_record(record.read_text())["streams"][0] == "never"
    with pytest.raises(SystemExit, match="ZS_GPU_STAGES names bogus: allowed are all, the groups"):
        stages.chosen("tests,bogus")
    assert {s.name for s in stages.chosen("bench")} == {"bench"}
    assert {s.name for s in stages.chosen("benches")} == {"bench", "bench-inference"}
    assert "search" not in {s.name for s in stages.chosen("all")}
