"""The C++ library as a LibTorch program gets it: `cmake --install` of the build's
zeroshard_cpp component into a fresh prefix, examples/cpp copied out of the tree and
built against find_package(zeroshard), then trained on 2 real ranks. The example checks
its parameters against torch's AdamW on every rank's data (exit 1 past 1e-5)."""
import os
import re
import shutil
import subprocess

from conftest import BUILD, ROOT, free_port, rank_env

PROJECT_FOLDERS = ("common", "config", "plan", "sharding", "offload", "engine", "bindings",
                   "tools")

CONFIG = """\
train_micro_batch_size_per_gpu: 8
optimizer:
  type: AdamW
  params:
    lr: 1.0e-2
zero_optimization:
  stage: 3
  stage3_param_persistence_threshold: 0
"""


def cached(name):
    """A value of the build's CMakeCache.txt (the Torch it was configured with)."""
    text = open(os.path.join(BUILD, "CMakeCache.txt"), encoding="utf-8").read()
    m = re.search(rf"^{name}:[A-Z]+=(.*)$", text, re.M)
    assert m, f"{name} not in {BUILD}/CMakeCache.txt"
    return m.group(1)


def run(cmd, **kwargs):
    r = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_a_libtorch_program_builds_against_the_installed_package_and_trains(tmp_path):
    prefix, source, build = tmp_path / "prefix", tmp_path / "example", tmp_path / "build"
    run(["cmake", "--install", BUILD, "--prefix", str(prefix), "--component", "zeroshard_cpp"])

    # What is installed: the library, the package config, and the public headers alone,
    # which include no header of the project's own folders.
    headers = sorted(os.listdir(prefix / "include" / "zeroshard"))
    assert headers == ["Engine.h", "Types.h"], headers
    for h in headers:
        for inc in re.findall(r'#include "([^"]+)"', (prefix / "include" / "zeroshard" / h).read_text()):
            assert inc.startswith("zeroshard/") and inc.split("/")[0] not in PROJECT_FOLDERS, (h, inc)
    assert (prefix / "lib" / "cmake" / "zeroshard" / "zeroshardConfig.cmake").is_file()
    assert any(f.startswith("libzeroshard.so") for f in os.listdir(prefix / "lib"))

    shutil.copytree(os.path.join(ROOT, "examples", "cpp"), source)
    run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={prefix}", f"-DTorch_DIR={cached('Torch_DIR')}"])
    run(["cmake", "--build", str(build)])
    exe = build / "zeroshard-example"
    linked = run(["ldd", str(exe)])
    assert str(prefix / "lib" / "libzeroshard.so") in linked, linked  # not the build tree's

    (tmp_path / "config.yaml").write_text(CONFIG)
    port = free_port()
    procs = [subprocess.Popen([str(exe), str(tmp_path / "config.yaml"), "12"], cwd=tmp_path,
                              env=rank_env(r, 2, port), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=180)[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r}: exit {p.returncode}\n{log}"
    m = re.search(r"max \|engine - torch AdamW\| over every parameter: (\S+)", logs[0])
    assert m and float(m.group(1)) <= 1e-5, logs[0]
    losses = [float(x) for x in re.findall(r"step \d+  loss (\S+)", logs[0])]
    assert len(losses) == 12, logs[0]
    assert "optimizer_states" in logs[0]  # the public memory report
