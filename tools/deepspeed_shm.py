"""DeepSpeed's shared-memory all-reduce buffers, removed once no process uses them.

On the CPU accelerator, every DeepSpeed init_distributed creates one file a rank in /dev/shm
(deepspeed_allreduce_buffer_<uid>_<address>_<port>_<rank>, 69,206,024 bytes each with
DeepSpeed 0.19) and never unlinks it: /dev/shm is memory, so each reference run that checks
zeroshard against DeepSpeed keeps 69 MB a rank held after its processes are gone. A full
./zs test left about 10 GB so; two runs on one machine left 22 GB of its 24, and the next
run's tests, with 2 GB to run in, took 87 times as long (a 1.7 s test took 148 s).

A buffer is removed only when no live process maps it or holds it open, and when it was last
changed more than MIN_AGE_S ago: a rank creates its file, writes it whole and maps it at once,
and its peers wait for that file by name, so a file in use, or one being set up by a run
beside this one, is never touched.

As a program (./zs test and ./zs bench before they start, tests/python/conftest.py after each
test file): removes such buffers and prints what it removed, if anything.
"""
import os
import sys
import time

SHM = "/dev/shm"
PREFIX = "deepspeed_allreduce_buffer_"
MIN_AGE_S = 60


def _paths_in_use():
    """Every /dev/shm path a process of this machine maps or has open."""
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    at = line.find(SHM + "/")
                    if at >= 0:
                        used.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
            fd_dir = f"/proc/{pid}/fd"
            for fd in os.listdir(fd_dir):
                target = os.readlink(os.path.join(fd_dir, fd))
                if target.startswith(SHM + "/"):
                    used.add(target)
        except OSError:  # the process ended, or is not ours to read
            continue
    return used


def remove_unused(min_age_s=MIN_AGE_S, now=None):
    """Removes the buffers no process uses; returns (files removed, bytes freed)."""
    try:
        names = [n for n in os.listdir(SHM) if n.startswith(PREFIX)]
    except OSError:
        return 0, 0
    if not names:
        return 0, 0
    now = time.time() if now is None else now
    in_use = _paths_in_use()
    count = freed = 0
    for name in names:
        path = os.path.join(SHM, name)
        try:
            st = os.stat(path)
            if path in in_use or now - st.st_mtime < min_age_s:
                continue
            os.unlink(path)
        except OSError:  # gone already, or another cleaner's
            continue
        count, freed = count + 1, freed + st.st_size
    return count, freed


def main():
    count, freed = remove_unused()
    if count:
        print(f"removed {count} of DeepSpeed's shared-memory all-reduce buffers that no "
              f"process used ({freed / 2**30:.1f} GiB of {SHM})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
