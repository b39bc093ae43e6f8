"""DeepSpeed's compiled ops, built once before anything runs DeepSpeed: the tests that check
zeroshard against DeepSpeed itself (a CTest fixture, bindings/CMakeLists.txt) and the benches
with DeepSpeed rows (bench peers, bench gpu).

DeepSpeed compiles its ops on first use (torch.utils.cpp_extension, -march=native: they cannot
be built on one machine for another). On the CPU accelerator a run of its engine builds
three: the shared-memory all-reduce at init_distributed, FusedAdam for Adam on the device and
CPU Adam for an offloaded optimizer (47 s for CPU Adam alone on this project's 2-core machine,
minutes beside other work). Built inside a test or a bench row, that time counts against the
row's limit; and a build killed half-way (a test's timeout) leaves its `lock` file behind, on
which every later build waits for ever (torch's FileBaton): every DeepSpeed run after it hangs.

So the build gets a folder of its own (TORCH_EXTENSIONS_DIR, build/torch_extensions), the
locks left there are removed (nothing else builds there while this runs: the tests that use
DeepSpeed wait for it, the benches run one row at a time), and each op is built in a process
of its own with its own limit. A build that fails leaves the runs to fail with DeepSpeed's own
message.

A fresh checkout (CI's) would build the ops cold every time (146 s on an idle 2-core machine,
about 5 minutes beside the rest of the tests). So where build/torch_extensions does not exist
yet, it becomes a link to a folder of this machine's cache named by everything the objects
depend on: DeepSpeed's and torch's versions, the Python, the compiler and the CPU's flags
(the ops are built with -march=native). Another version or another machine gets another
folder; within one, torch's loader rebuilds an op whose sources or flags changed. A missing or
stale cache costs the build's time, never a wrong op. (The build lines name DeepSpeed's
sources by the interpreter's path; ./zs runs the venv by its own path, not the checkout's
.venv link, so they are the same in a clone in another folder.)

As a program (the CTest fixture): builds the CPU accelerator's ops, prints how it went, exits
1 if one could not be built; where DeepSpeed is not installed, says so and exits 0.
"""
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What DeepSpeed's engine builds on each accelerator (names its accelerators' create_op_builder
# takes). On a GPU the benches offload the optimizer: CPU Adam is the one op they need.
CPU_OPS = ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder")
GPU_OPS = ("CPUAdamBuilder",)
LOAD = ("from deepspeed.accelerator import get_accelerator; "
        "get_accelerator().create_op_builder({!r}).load()")


def cache_key(cpu):
    """What DeepSpeed's compiled ops depend on besides their sources, as a folder name."""
    def version(package):
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "none"
    compiler = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True,
                              text=True).stdout.splitlines()[:1]
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    deepspeed, torch = version("deepspeed"), version("torch")
    parts = [deepspeed, torch, sys.version, platform.machine(), " ".join(compiler), flags,
             "cpu" if cpu else "gpu"]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"deepspeed-{deepspeed}-torch-{torch}-{digest}"


def extensions_folder(cpu):
    """TORCH_EXTENSIONS_DIR (build/torch_extensions unless set), made a link to this
    machine's cache of the ops where it does not exist yet (see the module's note)."""
    folder = os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                                   os.path.join(ROOT, "build", "torch_extensions"))
    if os.path.islink(folder) or not os.path.exists(folder):
        cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                             os.path.join(os.path.expanduser("~"), ".cache"),
                             "zeroshard", "torch_extensions", cache_key(cpu))
        os.makedirs(cache, exist_ok=True)
        if os.path.realpath(folder) != os.path.realpath(cache):
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            tmp = f"{folder}.link.{os.getpid()}"
            os.symlink(cache, tmp)
            os.replace(tmp, folder)  # atomic: a reader sees the old link or the new one
    os.makedirs(folder, exist_ok=True)
    return folder


def remove_locks(folder):
    """Removes the lock files builds killed half-way left in folder; returns where they were."""
    left = []
    for where, _, files in os.walk(folder):
        if "lock" in files:
            os.remove(os.path.join(where, "lock"))
            left.append(os.path.relpath(where, folder))
    return left


def build_one(builder, env, timeout):
    """Builds one op in a process of its own; returns one line saying how it went and
    whether it is ready."""
    start = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", LOAD.format(builder)], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{builder}: still compiling after {timeout} s", False
    seconds = time.monotonic() - start
    if p.returncode != 0:
        last = " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
        return f"{builder} could not be built ({seconds:.0f} s): {last}", False
    return f"{builder} ready in {seconds:.0f} s", True


def prepare(cpu, timeout=1800):
    """Builds the ops (cpu: DeepSpeed's CPU accelerator's, else CPU Adam on the GPU's);
    returns one line saying how it went, and whether every op is ready."""
    folder = extensions_folder(cpu)
    left = remove_locks(folder)
    note = f"; removed the lock a killed build left in {', '.join(left)}" if left else ""
    env = dict(os.environ, **({"DS_ACCELERATOR": "cpu"} if cpu else {}))
    results = [build_one(b, env, timeout) for b in (CPU_OPS if cpu else GPU_OPS)]
    said = "; ".join(line for line, _ in results)
    return (f"DeepSpeed's ops in {folder}: {said}{note}",
            all(ready for _, ready in results))


def main():
    if importlib.util.find_spec("deepspeed") is None:
        print("DeepSpeed is not installed with this Python: no op to build")
        return 0
    line, ready = prepare(cpu=True)
    print(line)
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main())
