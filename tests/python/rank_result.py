"""A rank's result written for the test that started it, and the rank gone without the
interpreter's finalization (the peers' runs: DeepSpeed, DDP, the Trainer).

A Gloo worker thread may still be releasing the last collective's tensors, which Python
owns: it waits for the GIL, finalization makes it exit, and unwinding its noexcept
destructor aborts the process ("terminate called without an active exception", exit -6,
after the results were written; seen in 2 runs of 12 of the Trainer's DDP runs, 1 in 4 of
DeepSpeed's tiled ALST loop, and in DeepSpeed's PipelineModule runs). zeroshard's own
engine waits for such threads at exit (_common/launch.py quiet_threads)."""
import json
import os
import sys


def leave(out, result):
    """Writes this rank's result to OUT.rankN.json and exits 0 at once."""
    with open(f"{out}.rank{int(os.environ['RANK'])}.json", "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
