"""The warm interpreter test ranks start from (forkserver.py) gives what subprocess.Popen
gives: the script's argv, environment and working directory, its output, its exit
status (negative for a signal), a timeout that leaves it running, and kill(); a request
whose start-up environment differs from the server's is started the ordinary way, one
whose PYTHONPATH differs gets the path Python gives it; and
transformers is imported before a rank whose script names it, and only then."""
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

import forkserver
from conftest import free_port, rank_env

SCRIPT = """import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "X", os.environ.get("ZS_TEST_X"),
      "path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)), flush=True)
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if sys.argv[1] == "raise":
    raise ValueError("from the script")
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
if sys.argv[1] == "sleep":
    import time
    time.sleep(60)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return str(path)


def env(**extra):
    return dict(rank_env(0, 1, free_port()), **extra)


def test_a_forked_rank_runs_the_script_as_python_would(script, tmp_path):
    proc = forkserver.start([script, "exit", "3"], env(ZS_TEST_X="given"), cwd=str(tmp_path))
    assert isinstance(proc, forkserver.ForkedProcess)
    assert proc.pid != os.getpid()
    out, _ = proc.communicate(timeout=60)
    assert out == f"argv ['exit', '3'] cwd {tmp_path} X given path0 True\n"
    assert proc.returncode == 3


def test_exceptions_signals_timeouts_and_kill_read_as_popens(script):
    proc = forkserver.start([script, "raise"], env())
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "ValueError: from the script" in out, out
    proc = forkserver.start([script, "kill"], env())
    proc.communicate(timeout=60)
    assert proc.returncode == -9
    proc = forkserver.start([script, "sleep"], env())
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=2)
    proc.kill()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -9 and out.startswith("argv ['sleep']"), out


def test_another_start_up_environment_starts_the_ordinary_way(script):
    proc = forkserver.start([script, "exit", "0"], env(OMP_NUM_THREADS="2"))
    assert isinstance(proc, subprocess.Popen)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.startswith("argv ['exit', '0']"), out


PATH_SCRIPT = """import json, sys
import extra_module
print(json.dumps({"path": sys.path, "from": extra_module.__file__}))
"""


def test_another_pythonpath_is_served_with_the_path_python_gives_it(tmp_path):
    """PYTHONPATH and torchrun's TORCHELASTIC_* are read at run time: a rank whose values
    differ is still forked where PYTHONPATH holds the server's folders, its sys.path the
    one a fresh interpreter builds (the script's folder, PYTHONPATH's folders, the
    interpreter's own); a folder that would shadow a module the server has imported (json
    here) starts the ordinary way, as does a PYTHONPATH without the server's folders."""
    (tmp_path / "script.py").write_text(PATH_SCRIPT)
    plain = forkserver.start([str(tmp_path / "script.py")], env())  # the server, if none yet
    plain.communicate(timeout=60)  # (fails: no extra_module on its path)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "extra_module.py").write_text("")
    given = env(TORCHELASTIC_RUN_ID="zs")
    given["PYTHONPATH"] = os.pathsep.join([str(extra), given["PYTHONPATH"]])
    argv = [str(tmp_path / "script.py")]
    fresh = subprocess.run([sys.executable] + argv, env=given, capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    proc = forkserver.start(argv, given)
    assert isinstance(proc, forkserver.ForkedProcess)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    got, want = json.loads(out), json.loads(fresh.stdout)
    # The same folders in the same order, but a temporary folder each interpreter of the
    # oldest-torch leg adds for itself (the server's, or the fresh one's, at the end).
    own = os.path.join(tempfile.gettempdir(), "tmp")
    assert got["from"] == want["from"] and [p for p in got["path"] if not p.startswith(own)] \
        == [p for p in want["path"] if not p.startswith(own)], (got, want)
    (extra / "json.py").write_text("")  # the server imported json: it would be its own
    proc = forkserver.start(argv, given)
    assert isinstance(proc, subprocess.Popen)
    out, _ = proc.communicate(timeout=60)  # this json, as Python gives it, has no dumps
    assert proc.returncode == 1 and "module 'json' has no attribute 'dumps'" in out, out
    (extra / "json.py").unlink()
    proc = forkserver.start(argv, dict(given, PYTHONPATH=str(extra)))  # the server's left out
    assert isinstance(proc, subprocess.Popen)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(out)["path"][:2] == [str(tmp_path), str(extra)]


def test_transformers_is_imported_before_the_ranks_that_name_it_only(tmp_path):
    pytest.importorskip("transformers")
    # The plain script must not name it: the name is put together.
    check = ("import sys\nname = 'trans' + 'formers.trainer'\n"
             "print(sorted(m for m in ('torch', name) if m in sys.modules))\n")
    plain, hf = tmp_path / "plain.py", tmp_path / "hf.py"
    plain.write_text(check)
    hf.write_text("# a transformers worker\n" + check)
    client, outs = forkserver.Client(env(), shared=False), []  # its own, fresh
    try:
        for path in (plain, hf, plain):
            proc = client.start([str(path)], env())
            outs.append(proc.communicate(timeout=120)[0].strip())
            assert proc.returncode == 0, outs[-1]
    finally:
        client.close()
    # The first plain rank started before any import; the last one shares the server's.
    assert outs == ["['torch']", "['torch', 'transformers.trainer']",
                    "['torch', 'transformers.trainer']"], outs


def test_the_servers_imports_are_frozen_and_a_ranks_exit_is_pythons(tmp_path):
    """What the server imported is out of the collector's sight in a rank (gc.freeze: its
    exit then skips walking torch's objects), while the script's own objects are collected
    and finalized as `python SCRIPT` does: a cycle during the run, the globals' finalizers
    at exit after the atexit handlers."""
    path = tmp_path / "exit.py"
    path.write_text(
        "import atexit, gc, sys\n"
        "class Noisy:\n"
        "    def __init__(self, name): self.name = name\n"
        "    def __del__(self): print('del', self.name, flush=True)\n"
        "print('frozen', gc.get_freeze_count() > 100_000, flush=True)\n"
        "cycle = Noisy('cycle'); cycle.me = cycle; del cycle\n"
        "print('collected', gc.collect() > 0, flush=True)\n"
        "kept = Noisy('global')\n"
        "atexit.register(lambda: print('atexit', flush=True))\n")
    proc = forkserver.start([str(path)], env())
    assert isinstance(proc, forkserver.ForkedProcess)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert out.split("\n") == ["frozen True", "del cycle", "collected True", "atexit",
                               "del global", ""], out


def test_one_server_serves_every_session_of_a_run_and_stops_with_it(tmp_path, monkeypatch):
    """The run's server (--shared-start, a CTest fixture) serves a session whose start-up
    environment is its own: the rank's monitor is its child; --shared-stop ends it."""
    folder = str(tmp_path / "run")
    starter = subprocess.run([sys.executable, forkserver.__file__, "--shared-start", folder],
                             capture_output=True, text=True, timeout=300)
    assert starter.returncode == 0, starter.stdout + starter.stderr
    monkeypatch.setenv(forkserver.SHARED, os.path.join(folder, "server.json"))
    record = forkserver.shared_server()
    try:
        script = tmp_path / "parent.py"
        script.write_text("import os\nprint(open(f'/proc/{os.getppid()}/stat').read()"
                          ".split()[3])\n")
        client = forkserver.Client(env())
        assert client.path == record["path"] and client.proc is None
        proc = client.start([str(script)], env())
        assert proc.communicate(timeout=60)[0].strip() == str(record["pid"])
    finally:
        subprocess.run([sys.executable, forkserver.__file__, "--shared-stop", folder],
                       check=True, timeout=60)
    deadline = time.monotonic() + 10
    while forkserver.alive(record["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert forkserver.shared_server() is None and not forkserver.alive(record["pid"])
