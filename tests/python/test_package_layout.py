"""The Python package's layout (docs/architecture.md): its rooms import only the rooms
below them (tests/layering_check.py, run here on a copy with an import that points up),
and every import line and zeroshard.* name that README.md and docs/ show still resolves."""
import importlib
import os
import re
import shutil
import sys

import pytest

from conftest import ROOT, main_leg_only

sys.path.insert(0, os.path.join(ROOT, "tests"))
import layering_check  # noqa: E402

pytestmark = main_leg_only  # the package's own layout, the same on every torch

SHOWN_FILES = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
IMPORT_LINE = re.compile(r"^[+ ]?\s*(from zeroshard[\w.]* import [\w, ]+|import zeroshard[\w.]*)"
                         r"(?: as \w+)?", re.M)
# zeroshard.a.b in prose, not a file name (bindings/zeroshard/..., zeroshard.so) nor a
# private module.
DOTTED = re.compile(r"(?<![/\w.-])zeroshard((?:\.[A-Za-z]\w*)+)(?![\w/-])")
FILE_SUFFIXES = {"so", "py", "diff", "md", "json", "yaml"}


def shown():
    """{(file, what it shows): python statement that resolves it}"""
    found = {}
    for name in SHOWN_FILES:
        text = open(os.path.join(ROOT, name), encoding="utf-8").read()
        for m in IMPORT_LINE.finditer(text):
            found[(name, m.group(1))] = m.group(1)
        for m in DOTTED.finditer(text):
            parts = m.group(1)[1:].split(".")
            if parts[-1] in FILE_SUFFIXES:
                continue
            found[(name, "zeroshard." + ".".join(parts))] = parts
    return found


def resolve(parts):
    """zeroshard.a.b.c: the longest importable module, then attributes."""
    for cut in range(len(parts), -1, -1):
        module = ".".join(["zeroshard"] + parts[:cut])
        try:
            value = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if not module.startswith(e.name or "\0"):
                raise
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ImportError("zeroshard")


def test_every_import_and_name_the_docs_show_resolves():
    entries = shown()
    assert len(entries) > 30, entries  # the scan found README's and docs' lines
    failed = []
    for (where, what), how in sorted(entries.items(), key=lambda kv: kv[0]):
        try:
            if isinstance(how, str):
                exec(how, {})
            else:
                resolve(how)
        except Exception as e:  # noqa: BLE001 (each failure is reported with its line)
            failed.append(f"{where}: {what}: {type(e).__name__}: {e}")
    assert not failed, "\n".join(failed)


def copy_of_the_package(tmp_path):
    root = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "bindings", "zeroshard"),
                    root / "bindings" / "zeroshard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root / "bindings" / "zeroshard"


def test_the_layering_check_passes_on_the_package_as_it_is():
    assert layering_check.check_python(ROOT) == []


def test_a_room_importing_a_room_above_it_is_refused(tmp_path):
    package = copy_of_the_package(tmp_path)
    with open(package / "_parallel" / "sync_batchnorm.py", "a") as f:
        f.write("\n\ndef later():\n    from .._engine.engine import ZeroShardEngine\n")
    broken = layering_check.check_python(str(tmp_path / "src"))
    assert ("bindings/zeroshard/_parallel/sync_batchnorm.py: imports _engine/engine (the room "
            "_engine), above the room _parallel (it may import _activations, _common)") in broken, broken


def test_a_room_importing_a_public_face_is_refused(tmp_path):
    package = copy_of_the_package(tmp_path)
    with open(package / "_common" / "launch.py", "a") as f:
        f.write("\nfrom zeroshard.zero import GatheredParameters\n")
    broken = layering_check.check_python(str(tmp_path / "src"))
    assert any(line.startswith("bindings/zeroshard/_common/launch.py: imports zero (a public "
                               "face), above the room _common") for line in broken), broken


def test_a_module_at_the_top_must_be_a_public_face(tmp_path):
    package = copy_of_the_package(tmp_path)
    (package / "_helpers.py").write_text('"""x"""\n')
    broken = layering_check.check_python(str(tmp_path / "src"))
    assert any(line.startswith("bindings/zeroshard/_helpers.py: a module at the top that is no "
                               "public face") for line in broken), broken


def test_a_folder_of_more_than_fifteen_modules_is_refused(tmp_path):
    package = copy_of_the_package(tmp_path)
    for i in range(16 - len(os.listdir(package / "_parallel")) + 2):
        (package / "_parallel" / f"axis{i}.py").write_text('"""x"""\n')
    broken = layering_check.check_python(str(tmp_path / "src"))
    assert any(line.startswith("bindings/zeroshard/_parallel/: ") and "more than 15" in line
               for line in broken), broken
