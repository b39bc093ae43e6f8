"""DeepSpeed's CPU Adam, built before any DeepSpeed row is timed (bench peers, bench gpu).

DeepSpeed compiles it on first use (torch.utils.cpp_extension, -march=native: it cannot be
built on one machine for another), which took about 10 minutes on this project's 2-core
machine. Inside a row that time counts against the row's limit. And a build killed half-way
leaves its `lock` file behind, on which every later build waits for ever (torch's
FileBaton): that is how `bench gpu`'s CPU check once "hung" for more than 300 s.

So the benches give the build a folder of their own (TORCH_EXTENSIONS_DIR, under the build
folder, kept between runs), remove the locks left there (the benches run one row at a time,
so no build of theirs is under way when one starts), and build it in a process of its own
with its own limit. A build that fails leaves the rows to fail with DeepSpeed's own message.
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOAD = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"


def prepare(cpu, timeout=1800):
    """Builds the op (cpu: DeepSpeed's CPU accelerator); returns one line saying how it went."""
    folder = os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                                   os.path.join(ROOT, "build", "torch_extensions"))
    os.makedirs(folder, exist_ok=True)
    left = []
    for where, _, files in os.walk(folder):
        if "lock" in files:
            os.remove(os.path.join(where, "lock"))
            left.append(os.path.relpath(where, folder))
    note = f"; removed the lock a killed build left in {', '.join(left)}" if left else ""
    env = dict(os.environ, **({"DS_ACCELERATOR": "cpu"} if cpu else {}))
    start = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"DeepSpeed's CPU Adam: still compiling after {timeout} s, in {folder}{note}"
    seconds = time.monotonic() - start
    if p.returncode != 0:
        last = " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
        return f"DeepSpeed's CPU Adam could not be built ({seconds:.0f} s): {last}{note}"
    return f"DeepSpeed's CPU Adam ready in {seconds:.0f} s, in {folder}{note}"
