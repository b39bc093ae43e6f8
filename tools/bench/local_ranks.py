"""The local ranks of the multi-rank benchmarks (tp_bench, pp_bench, seq_bench): the script
started again as each of `world` ranks on this machine (Gloo over 127.0.0.1, one thread
each), each writing its row to OUT.rankN.json."""
import json
import os
import subprocess
import sys


def run_ranks(script, args, world, out, timeout):
    """(every rank's row, None), or (None, the first failed rank's log tail)."""
    from zeroshard._tools.launcher import free_port
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", ZS_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, script, *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    bad = [r for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        return None, f"rank {bad[0]}: {logs[bad[0]][-2000:]}"
    rows = []
    for rank in range(world):
        with open(f"{out}.rank{rank}.json") as f:
            rows.append(json.load(f))
    return rows, None
