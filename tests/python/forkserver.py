"""Rank processes started from a warm interpreter. Most of a test rank's life is its start:
measured here, a 2-rank run of 12 training steps lasts 2.4 s a process, of which importing
torch takes 1.0 s and the import of torch._dynamo that torch.optim's first param group
makes (torch/_compile.py) 0.75 s. The Python tests start hundreds of such processes.

So one server process per test session imports torch once and forks a rank process per
request: a real process of its own (own pid, own address space, its own exit status and
signals), which runs the worker script as `python SCRIPT ARGS` would, with the test's
environment, working directory and output pipe. What an interpreter reads from the
environment while it starts and imports torch or transformers (PYTHON*, LD_*, OMP_*, the
BLAS thread counts, TORCH*/PYTORCH*, CUDA*, HF_*/TRANSFORMERS*, ...) is fixed in the server,
so a request whose values for those differ is started the ordinary way (subprocess.Popen),
as is any request when the server cannot run. PYTHONPATH and TORCHELASTIC_* are the
exceptions (RUNTIME). transformers is imported by the server
before the first rank whose script names it (PRELOAD_WHEN).

Protocol, one Unix socket connection per process: the client sends one JSON line
{argv, env, cwd, preload} with the write end of its output pipe (SCM_RIGHTS); the server forks a
monitor, which forks the rank process, writes its pid as a line, waits for it and writes
its exit code (Popen's: negative for a signal) as a second line.
One server can serve a whole CTest run (every test file, both ctest -j slots): a fixture
starts it before the Python tests and stops it after them (bindings/CMakeLists.txt); a test
session finds it through ZS_TEST_FORKSERVER_SHARED (the record --shared-start writes) and
uses it when its start-up environment is the session's, else starts its own as before.
Measured here, a server's start is 2-3 s of importing torch, and transformers' 2.5 s more:
once a run instead of once a file.
usage: forkserver.py SOCKET_PATH [WATCHED_PID]   the server (it exits with WATCHED_PID,
                                                 else when its stdin closes)
       forkserver.py --shared-start|--shared-stop FOLDER"""
import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Read while an interpreter starts or torch and transformers are imported: fixed in the
# server.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH",
                    "PYTORCH", "CUDA", "NVIDIA", "HF_", "HUGGINGFACE", "TRANSFORMERS",
                    "TOKENIZERS", "ACCELERATE", "USE_TORCH", "USE_TF", "USE_FLAX", "USE_JAX",
                    "DATASETS")


# What a rank spends seconds importing (transformers' Trainer: 1-2 s), and the names in a
# worker script that say it will: the server imports it before the first such rank, so a
# session that never starts one never pays for it.
PRELOAD = ["transformers.modeling_utils", "transformers.trainer"]
PRELOAD_WHEN = ("transformers", "trl", "hf_worker", "moe_models")


# Read at run time only, though their prefixes say otherwise: torchrun's TORCHELASTIC_*
# (torch.distributed.elastic and Lightning read them when asked), and PYTHONPATH where it
# holds the server's folders and more, from which the rank's sys.path is built as a fresh
# interpreter builds it (rank_path), unless a folder it adds holds a module named as one
# the server has imported (shadowed).
RUNTIME = ("TORCHELASTIC_", "PYTHONPATH")


def startup_env(env):
    return {k: v for k, v in env.items()
            if k.startswith(STARTUP_PREFIXES) and not k.startswith(RUNTIME)}


def _python_path(env, cwd=None):
    return [os.path.abspath(os.path.join(cwd or os.getcwd(), p))
            for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


_SERVER_PATH = _python_path(os.environ)  # in the server: the PYTHONPATH it started with


def shadowed(env, cwd):
    """Whether a folder env's PYTHONPATH adds to the server's holds a module of the name of
    one the server has imported: the rank would get the server's, not that one."""
    imported = {name.partition(".")[0] for name in sys.modules}
    for folder in (p for p in _python_path(env, cwd) if p not in _SERVER_PATH):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        if any(n.partition(".")[0] in imported for n in names if not n.startswith("_")):
            return True
    return False


def rank_path(script, env):
    """The sys.path `python SCRIPT` starts with under env's PYTHONPATH: the script's folder,
    PYTHONPATH's folders, then the interpreter's own (the server's, less its PYTHONPATH)."""
    return [os.path.dirname(os.path.abspath(script))] + _python_path(env) + \
        [p for p in sys.path[1:] if p not in _SERVER_PATH]


def preloads_of(script):
    try:
        with open(script, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    return PRELOAD if any(name in text for name in PRELOAD_WHEN) else []


class ForkedProcess:
    """What the tests use of subprocess.Popen (stdout=PIPE, stderr=STDOUT, text=True)."""

    def __init__(self, conn, out):
        self._conn, self._out, self._chunks, self._buf = conn, out, [], b""
        self.returncode = None
        self.pid = int(self._line(None) or 0)

    def _line(self, timeout):
        """The server's next line: b"" at the connection's end, None if `timeout` passes."""
        while b"\n" not in self._buf:
            if not select.select([self._conn], [], [], timeout)[0]:
                return None
            more = self._conn.recv(64)
            if not more:
                return b""
            self._buf += more
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _status(self, timeout):
        """Reads the exit code; False if `timeout` passes first."""
        line = self._line(timeout)
        if line is None:
            return False
        # The connection's end with no code: the monitor itself was killed.
        self.returncode = int(line) if line else -signal.SIGKILL
        self._conn.close()
        return True

    def communicate(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout

        def left():
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        while self._out is not None:
            if not select.select([self._out], [], [], left())[0]:
                raise subprocess.TimeoutExpired(self.pid, timeout)
            chunk = os.read(self._out, 1 << 16)
            if chunk:
                self._chunks.append(chunk)
            else:
                os.close(self._out)
                self._out = None
        if self.returncode is None and not self._status(left()):
            raise subprocess.TimeoutExpired(self.pid, timeout)
        return b"".join(self._chunks).decode(errors="replace"), None

    def kill(self):
        if self.returncode is None and self.pid > 0:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


DECLINED = -1  # the pid the server answers a request it leaves to the ordinary way
SHARED = "ZS_TEST_FORKSERVER_SHARED"  # names the record of the run's server


def shared_server():
    """The record {path, pid, fixed} of the run's server, if one is running."""
    try:
        with open(os.environ[SHARED], encoding="utf-8") as f:
            record = json.load(f)
        return record if alive(record["pid"]) else None
    except (KeyError, OSError, ValueError, TypeError):
        return None


class Client:
    """The test session's server: the run's (shared) where its start-up environment is
    this session's, else its own, started on first use; raises where it cannot start."""

    def __init__(self, env, shared=True):
        self.proc, self.dir = None, None
        record = shared_server() if shared else None
        if record and record["fixed"] == startup_env(env):
            self.path, self.fixed = record["path"], record["fixed"]
            self.python_path = record["python_path"]
            return
        self.dir = tempfile.mkdtemp(prefix="zs-forkserver-")
        self.path = os.path.join(self.dir, "socket")
        self.fixed = startup_env(env)
        self.python_path = _python_path(env)
        # Its stdin is a lifeline: the server exits when this process does.
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the fork server did not start: {ready!r}")
        atexit.register(self.close)

    def close(self):
        if self.proc is None:  # the run's server: the run stops it
            return
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)  # its socket

    def start(self, argv, env, cwd=None):
        """A ForkedProcess running `python argv...`, or None for a request it cannot serve."""
        if startup_env(env) != self.fixed or not argv or argv[0].startswith("-") or \
                not set(self.python_path) <= set(_python_path(env, cwd)):
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        read, write = os.pipe()
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd or os.getcwd(),
                              "preload": preloads_of(argv[0])})
        socket.send_fds(conn, [request.encode() + b"\n"], [write])
        os.close(write)
        proc = ForkedProcess(conn, read)
        if proc.pid == DECLINED:
            os.close(read)
            conn.close()
            return None
        if proc.pid <= 0:
            os.close(read)
            raise RuntimeError("the fork server gave no process")
        return proc


_client = None


def start(argv, env, cwd=None):
    """`python argv...` as a subprocess.Popen(stdout=PIPE, stderr=STDOUT, text=True) would
    run it, started from the session's warm interpreter where it can be."""
    global _client
    proc = None
    if os.environ.get("ZS_TEST_FORKSERVER", "1") != "0":
        try:
            if _client is None:
                _client = Client(env)
            proc = _client.start(argv, env, cwd)
        except (OSError, RuntimeError, ValueError) as e:
            print(f"forkserver: starting ordinarily ({e})", file=sys.stderr)
            _client = None
            os.environ["ZS_TEST_FORKSERVER"] = "0"
    if proc is None:
        proc = subprocess.Popen([sys.executable] + argv, env=env, cwd=cwd, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc


# --- the server ---------------------------------------------------------------------


def receive(conn):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise EOFError
        data += more
    return json.loads(data), fds[0]


def become_rank(request, out, conn, listener):
    """In the forked rank process: the state a fresh `python SCRIPT ARGS` would start in."""
    conn.close()
    listener.close()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    import random
    random.seed()  # a fresh interpreter seeds from the OS, each its own
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[:] = rank_path(script, request["env"])
    return script


def preload(modules):
    import importlib
    new = [name for name in modules if name not in sys.modules]
    for name in new:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  the rank imports it again and reports what fails
            pass
    if new:
        frozen()


def frozen():
    """What the server imported moved out of the collector's sight (gc.freeze): a rank's
    collections, and above all the one its interpreter makes at exit, would otherwise walk
    torch's and transformers' millions of module objects each time. Measured here: a
    2-rank run of a script that only imports torch spent 1.7-2.5 s of its 1.8-2.6 s
    finishing (interpreter exit); os._exit took 0.05 s. The objects stay alive as they
    would: modules live until exit."""
    import gc
    gc.collect()
    gc.freeze()


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def serve(path, watched=None):
    """Returns, in a forked rank process only, the script it is to run. It ends when the
    process `watched` does (the run's server) or else when its stdin closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    print("ready", flush=True)
    lifeline = [] if watched else [sys.stdin]
    while True:
        readable = select.select([listener] + lifeline, [], [], 2.0 if watched else None)[0]
        if sys.stdin in readable or (watched and not alive(watched)):  # the tests ended
            os._exit(0)
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        try:
            request, out = receive(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        preload(request.get("preload", []))
        if shadowed(request["env"], request["cwd"]):  # the client starts it the ordinary way
            conn.sendall(f"{DECLINED}\n".encode())
            conn.close()
            os.close(out)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() != 0:
            conn.close()
            os.close(out)
            continue
        # The monitor: starts the rank process, reports its pid and then its exit code.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pid = os.fork()
        if pid == 0:
            return become_rank(request, out, conn, listener)
        os.close(out)
        listener.close()
        try:
            conn.sendall(f"{pid}\n".encode())
            _, status = os.waitpid(pid, 0)
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        finally:
            os._exit(0)


def start_shared(folder):
    """Starts the run's server, watching this process's parent (ctest), and writes its
    record in `folder`; returns once it serves."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import rank_env  # the environment the tests' ranks start with
    stop_shared(folder)
    os.makedirs(folder, exist_ok=True)
    env = rank_env(0, 1, 0)
    path = os.path.join(tempfile.mkdtemp(prefix="zs-forkserver-"), "socket")
    log_path = os.path.join(folder, "server.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path,
                                 str(os.getppid())], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while True:
        with open(log_path, "rb") as log:
            said = log.read()
        if b"ready" in said:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"the run's fork server did not start (exit {proc.poll()}): {said!r}")
        time.sleep(0.1)
    record = os.path.join(folder, "server.json")
    with open(record + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"path": path, "pid": proc.pid, "fixed": startup_env(env),
                   "python_path": _python_path(env)}, f)
    os.replace(record + ".tmp", record)
    print(f"fork server {proc.pid} at {path}")


def stop_shared(folder):
    record = os.path.join(folder, "server.json")
    try:
        with open(record, encoding="utf-8") as f:
            server = json.load(f)
        os.remove(record)
    except (OSError, ValueError):
        return
    if alive(server["pid"]):
        os.kill(server["pid"], signal.SIGTERM)
    shutil.rmtree(os.path.dirname(server["path"]), ignore_errors=True)


if __name__ == "__main__" and sys.argv[1] in ("--shared-start", "--shared-stop"):
    (start_shared if sys.argv[1] == "--shared-start" else stop_shared)(sys.argv[2])
    sys.exit(0)

if __name__ == "__main__":
    import runpy

    import torch  # noqa: F401  what every rank imports first
    import torch.distributed  # noqa: F401
    try:
        import torch._dynamo  # noqa: F401  torch.optim's first param group imports it
    except ImportError:  # a torch built without it: its ranks do without it too
        pass
    frozen()

    # The script's globals kept to the end, as `python SCRIPT` keeps __main__'s: what they
    # hold is destroyed at shutdown, after the atexit handlers, not when the script ends.
    # Registered before the script runs, this handler runs after every one it registers
    # (last in, first out); left to the interpreter's teardown instead, a global's
    # finalizer ran where its output no longer reached the pipe.
    script = serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
    script_globals = []
    atexit.register(script_globals.clear)
    script_globals.append(runpy.run_path(script, run_name="__main__"))
