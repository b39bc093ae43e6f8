"""The pip package: `pip wheel .` (what `pip install .` runs, build isolation included)
builds zeroshard against the torch already installed; the wheel, installed into a fresh
venv, is imported from that venv's site-packages and trains two steps from a folder
outside the source tree, with the losses the in-tree build gives; its console commands
zeroshard-estimate, zeroshard-consolidate and zeroshard (the launcher) run."""
import glob
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys

import pytest

from conftest import BUILD, HERE, ROOT, run_ranks

STEPS, WORLD = 2, 2
CONFIG = {"zero_optimization": {"stage": 3}, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("scikit_build_core") is None,
    reason="no scikit-build-core beside this interpreter (the trixie leg): the wheel is "
           "built and tested on the main leg")


def build_wheel(dist):
    """pip wheel . with build isolation, as `pip install .` runs it, into its own build
    folder (build-wheel-TAG, pyproject.toml). Through ccache, with the folder left out of
    the hash and paths relative to the checkout (./zs sets CCACHE_BASEDIR): the command
    lines are those of ./zs build, so a warm cache gives the objects back instead of
    compiling everything again."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # The compiler by the name ./zs build's CMake chose (c++, where pip's would be g++:
    # the same program, but ccache hashes the name too).
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        cxx = next(line.split("=", 1)[1].strip() for line in f
                   if line.startswith("CMAKE_CXX_COMPILER:"))
    env["CMAKE_ARGS"] = f"-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER={cxx}"
    env["CCACHE_NOHASHDIR"] = "1"
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), ROOT],
                         env=env, capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, f"pip wheel . failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    wheels = glob.glob(str(dist / "zeroshard-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def fresh_venv(where):
    """A new venv whose own site-packages comes first; torch and the rest come from this
    interpreter's site-packages through a .pth file (installing torch's wheels again would
    take minutes and gigabytes, and would test pip, not zeroshard)."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = str(where / "bin" / "python")
    own = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(own, "zz_torch_from_main_venv.pth"), "w") as f:
        f.write(site.getsitepackages()[0] + "\n")
    return py, own


def test_wheel_installs_imports_and_trains(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    py, own_site = fresh_venv(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
                    "--no-index", wheel], check=True)

    outside = tmp_path / "job"  # no checkout here: only the worker script and its model
    outside.mkdir()
    for name in ("train_worker.py", "models.py"):
        shutil.copy(os.path.join(HERE, name), outside / name)
    env = {"PYTHONPATH": ""}
    where = subprocess.run([py, "-c", "import zeroshard; print(zeroshard.__file__)"], cwd=outside,
                           capture_output=True, text=True, env=dict(os.environ, **env))
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(own_site), where.stdout

    config = json.dumps(CONFIG)
    out = str(outside / "wheel")
    got = run_ranks([str(outside / "train_worker.py"), "zs", "gpt", str(STEPS), out, config],
                    WORLD, out, python=py, cwd=str(outside), extra_env=env)
    ref = str(tmp_path / "tree")
    want = run_ranks([os.path.join(HERE, "train_worker.py"), "zs", "gpt", str(STEPS), ref, config],
                     WORLD, ref)
    for rank in range(WORLD):
        assert len(got[rank]) == STEPS
        for a, b in zip(got[rank], want[rank]):
            assert abs(a - b) <= 1e-6 * abs(b), f"rank {rank}: wheel {a}, source tree {b}"

    bin_dir = os.path.dirname(py)
    est = subprocess.run([os.path.join(bin_dir, "zeroshard-estimate"), "--hf-config",
                          os.path.join(ROOT, "tests/data/hf/llama2_7b.json"), "--nodes", "1",
                          "--gpus-per-node", "8", "--gpu-mem", "80GB", "--cpu-mem", "512GB",
                          "--nvme", "2TB", "--seq", "4096", "--micro-batch", "1", "--bf16",
                          "--activation-checkpointing"],
                         capture_output=True, text=True, cwd=outside)
    assert est.returncode == 0, est.stdout[-2000:] + est.stderr  # 0: a plan fits (the demo's)
    assert "parameters: 6,738,415,616" in est.stdout, est.stdout[:2000]
    cons = subprocess.run([os.path.join(bin_dir, "zeroshard-consolidate"), "--help"],
                          capture_output=True, text=True, cwd=outside, env=dict(os.environ, **env))
    assert cons.returncode == 0 and "zeroshard-consolidate" in cons.stdout, cons.stderr
    launcher = subprocess.run([os.path.join(bin_dir, "zeroshard"), "--help"], capture_output=True,
                              text=True, cwd=outside, env=dict(os.environ, **env))
    assert launcher.returncode == 0 and "--num_gpus" in launcher.stdout, launcher.stderr


def test_a_build_for_another_torch_says_so(tmp_path):
    """The package refuses a torch other than the one it was built against, by name."""
    pkg = tmp_path / "zeroshard"
    shutil.copytree(os.path.join(BUILD, "python", "zeroshard"), pkg)
    with open(pkg / "_build_info.py", "w") as f:
        f.write('TORCH_VERSION = "1.0.0"\nCUDA = False\n')
    run = subprocess.run([sys.executable, "-c", "import zeroshard"], cwd=tmp_path,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert run.returncode != 0
    assert "zeroshard was built against torch 1.0.0, but this interpreter imports torch" in run.stderr
