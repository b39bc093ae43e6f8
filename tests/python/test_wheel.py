"""The pip package: `pip wheel .` (what `pip install .` runs, build isolation included)
builds zeroshard against the torch already installed; the wheel, installed beside torch in
a fresh venv, runs in a root that has only Python, torch and the C and C++ runtimes (no
-dev package, no yaml-cpp, liburing or CUDA toolkit: tests/python/bare_root.py): it is
imported from that venv's site-packages and trains two steps on 2 ranks from a folder
outside the source tree, with the losses the in-tree build gives; its console commands
zeroshard-estimate, zeroshard-consolidate and zeroshard (the launcher) run; the dynamic
loader finds each library its binaries link in the wheel, torch or the C runtime; and
without its GPU half it still imports and says why a GPU model cannot train."""
import glob
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys

import pytest

import bare_root
from conftest import BUILD, HERE, ROOT, run_ranks

STEPS, WORLD = 2, 2
CONFIG = {"zero_optimization": {"stage": 3}, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("scikit_build_core") is None,
    reason="no scikit-build-core beside this interpreter (the trixie leg): the wheel is "
           "built and tested on the main leg")


def build_wheel(dist):
    """`./zs wheel DIST`: pip wheel . with build isolation, as `pip install .` runs it, in
    its own build folder (build-wheel-TAG, pyproject.toml), through ccache."""
    run = subprocess.run([os.path.join(ROOT, "zs"), "wheel", str(dist)], capture_output=True,
                         text=True, timeout=3000)
    assert run.returncode == 0, f"./zs wheel failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    wheels = glob.glob(str(dist / "zeroshard-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def fresh_venv(where):
    """A new venv whose site-packages holds this interpreter's packages (torch, the
    nvidia-* wheels, ...) as links to them, so that zeroshard is installed beside torch as
    pip puts it (installing torch's wheels again would take minutes and gigabytes, and would
    test pip, not zeroshard)."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = str(where / "bin" / "python")
    own = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    main = site.getsitepackages()[0]
    for name in os.listdir(main):
        if not name.startswith(("zeroshard", "_distutils_hack", "distutils-precedence")):
            os.symlink(os.path.join(main, name), os.path.join(own, name))
    return py, own


# The libraries a wheel's binaries may need from the system: manylinux's list of what
# every Linux has (the C and C++ runtimes, zlib).
SYSTEM_LIBRARIES = ("linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6",
                    "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
                    "libstdc++.so.6", "libgcc_s.so.1", "libz.so.1")


def loader_listing(enter, binary):
    """What the dynamic loader resolves for `binary` inside the root: {soname: path}."""
    run = subprocess.run(enter + ["/lib64/ld-linux-x86-64.so.2", "--list", binary],
                         capture_output=True, text=True, cwd=os.path.dirname(binary))
    assert run.returncode == 0, run.stdout + run.stderr
    listing = {}
    for line in run.stdout.splitlines():
        name, _, where = line.strip().partition(" => ")
        listing[name.split()[0]] = where.split(" (")[0] if where else name.split()[0]
    return listing, run.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="the bare root is entered with chroot in a mount namespace: root only")
def test_wheel_installs_imports_and_trains_in_a_bare_root(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    py, own_site = fresh_venv(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
                    "--no-index", wheel], check=True)
    installed = os.path.join(own_site, "zeroshard")
    # The libraries it carries: yaml-cpp and liburing, none of torch's or the C runtime's.
    carried = sorted(os.listdir(os.path.join(installed, "_libs")))
    assert sorted({n.split(".so")[0] for n in carried}) == ["liburing", "libyaml-cpp"], carried

    root = str(tmp_path / "root")
    os.mkdir(root)
    packages = bare_root.make(root)
    for absent in ("libyaml-cpp0.7", "liburing2", "libyaml-cpp-dev", "liburing-dev"):
        assert absent not in packages, sorted(packages)
    assert not glob.glob(root + "/usr/lib/x86_64-linux-gnu/libyaml-cpp*")
    assert not glob.glob(root + "/usr/lib/x86_64-linux-gnu/liburing*")
    assert not os.path.exists(root + "/usr/local/cuda")
    main_venv = os.path.dirname(os.path.dirname(os.path.dirname(site.getsitepackages()[0])))
    enter = bare_root.entry(root, [sys.base_prefix, main_venv, str(tmp_path)],
                            str(tmp_path / "enter.sh"))

    # Each binary's libraries: in the wheel, torch's install, or the system's runtime.
    torch_site = os.path.realpath(site.getsitepackages()[0])
    binaries = glob.glob(os.path.join(installed, "*.so")) + [
        os.path.join(installed, "bin", "zeroshard-estimate")]
    for binary in binaries:
        listing, text = loader_listing(enter, binary)
        print(f"ld.so --list {binary}:\n{text}")
        for name, where in listing.items():
            assert where != "not found", f"{binary}: {name} not found in the bare root:\n{text}"
            inside = where.startswith((installed, os.path.join(own_site, "torch"),
                                       os.path.join(own_site, "nvidia"), torch_site))
            assert inside or os.path.basename(name) in SYSTEM_LIBRARIES, \
                f"{binary} links {name} ({where}): neither the wheel's, torch's nor the C runtime's"

    outside = tmp_path / "job"  # no checkout here: only the worker script and its model
    outside.mkdir()
    for name in ("train_worker.py", "models.py"):
        shutil.copy(os.path.join(HERE, name), outside / name)
    env = {"PYTHONPATH": "", "LD_LIBRARY_PATH": ""}
    host_env = dict(os.environ, **env)
    where = subprocess.run(enter + [py, "-c", "import zeroshard; print(zeroshard.__file__)"],
                           cwd=outside, capture_output=True, text=True, env=host_env)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(own_site), where.stdout

    config = json.dumps(CONFIG)
    out = str(outside / "wheel")
    got = run_ranks([str(outside / "train_worker.py"), "zs", "gpt", str(STEPS), out, config],
                    WORLD, out, python=py, cwd=str(outside), extra_env=env,
                    launch=lambda rank: (enter, {}))
    ref = str(tmp_path / "tree")
    want = run_ranks([os.path.join(HERE, "train_worker.py"), "zs", "gpt", str(STEPS), ref, config],
                     WORLD, ref)
    for rank in range(WORLD):
        assert len(got[rank]) == STEPS
        for a, b in zip(got[rank], want[rank]):
            assert abs(a - b) <= 1e-6 * abs(b), f"rank {rank}: wheel {a}, source tree {b}"

    bin_dir = os.path.dirname(py)
    shutil.copy(os.path.join(ROOT, "tests/data/hf/llama2_7b.json"), outside)
    est = subprocess.run(enter + [os.path.join(bin_dir, "zeroshard-estimate"), "--hf-config",
                                  str(outside / "llama2_7b.json"), "--nodes", "1",
                                  "--gpus-per-node", "8", "--gpu-mem", "80GB", "--cpu-mem",
                                  "512GB", "--nvme", "2TB", "--seq", "4096", "--micro-batch", "1",
                                  "--bf16", "--activation-checkpointing"],
                         capture_output=True, text=True, cwd=outside, env=host_env)
    assert est.returncode == 0, est.stdout[-2000:] + est.stderr  # 0: a plan fits (the demo's)
    assert "parameters: 6,738,415,616" in est.stdout, est.stdout[:2000]
    cons = subprocess.run(enter + [os.path.join(bin_dir, "zeroshard-consolidate"), "--help"],
                          capture_output=True, text=True, cwd=outside, env=host_env)
    assert cons.returncode == 0 and "zeroshard-consolidate" in cons.stdout, cons.stderr
    launcher = subprocess.run(enter + [os.path.join(bin_dir, "zeroshard"), "--help"],
                              capture_output=True, text=True, cwd=outside, env=host_env)
    assert launcher.returncode == 0 and "--num_gpus" in launcher.stdout, launcher.stderr

    # Without its GPU half (as beside a torch without CUDA, which cannot load it), the
    # package imports, and says why a model on a GPU cannot train.
    cuda_half = os.path.join(installed, "libzeroshard_cuda.so")
    assert os.path.exists(cuda_half)
    os.remove(cuda_half)
    why = subprocess.run(enter + [py, "-c", "import zeroshard._zeroshard as z; print(z.gpu_unavailable())"],
                         capture_output=True, text=True, cwd=outside, env=host_env)
    assert why.returncode == 0, why.stderr
    assert "built with CUDA, but its GPU half does not load beside this process's torch" in \
        why.stdout and "libzeroshard_cuda.so" in why.stdout, why.stdout


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
