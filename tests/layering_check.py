"""The layers hold: no file includes a header of a layer above its own, the planning
layers build without LibTorch, inside engine/ only the engine's own files include the
engine's header (its parts sit below it), and the Python package's rooms import only the
rooms below them, without a cycle, its implementation behind `_`-prefixed names
(docs/architecture.md).
A test: exits 1 naming each include or import that breaks a rule.
usage: layering_check.py SOURCE_DIR"""
import os
import re
import sys

# What each folder may include, besides itself.
# include/zeroshard/ (quoted "zeroshard/...") is the public API, below every layer: a
# program that uses the engine sees those headers and no other.
BELOW = {
    "include": set(),
    "common": set(),
    "cuda": {"common"},
    "config": {"common"},
    "plan": {"common", "config"},
    "sharding": {"common", "cuda"},
    "offload": {"common", "cuda"},
    "optim": {"common", "cuda", "config", "plan", "sharding", "offload"},
    "engine": {"common", "cuda", "config", "plan", "sharding", "offload", "optim"},
    "bindings": {"common", "cuda", "config", "plan", "sharding", "offload", "optim", "engine"},
    "tools": {"common", "cuda", "config", "plan", "sharding", "offload", "optim", "engine"},
}
TORCH = re.compile(r'#include <(torch|ATen|c10|caffe2)/')
PROJECT = re.compile(r'#include "([a-z_]+)/([^"]+)"')


def sources(root, folder):
    for base, _, files in os.walk(os.path.join(root, folder)):
        for f in files:
            if f.endswith((".h", ".cpp", ".cc")):
                yield os.path.join(base, f)


def check(root):
    broken = []
    for folder, below in BELOW.items():
        for layer_root in (folder, os.path.join("tests", folder)):
            # Tests sit above every layer; they may also start ranks with tools/launch.
            in_tests = layer_root.startswith("tests")
            allowed = below | {"zeroshard"} | ({"tests", "tools"} if in_tests else set())
            if folder != "include":
                allowed.add(folder)
            for path in sources(root, layer_root):
                rel = os.path.relpath(path, root)
                text = open(path, encoding="utf-8").read()
                for m in PROJECT.finditer(text):
                    if m.group(1) not in allowed:
                        broken.append(f"{rel}: includes {m.group(1)}/{m.group(2)}, above "
                                      f"{folder}/ (it may include {', '.join(sorted(allowed))})")
                if folder in ("config", "plan") and not layer_root.startswith("tests"):
                    for m in TORCH.finditer(text):
                        broken.append(f"{rel}: includes LibTorch ({m.group(0)}); {folder}/ "
                                      "builds without it")
    return broken


# engine/'s top: the engine class and its builder. Every other file in engine/ is a part
# the engine composes, and includes neither.
ENGINE_TOP = {"engine/EngineImpl.h", "engine/EngineBuilder.h"}
ENGINE_OWN = {"Engine.cpp", "EngineImpl.h", "EngineImpl.cpp", "EngineBuilder.h",
              "EngineBuilder.cpp", "EngineOptimizer.cpp", "EngineUnits.cpp"}


def check_engine(root):
    broken = []
    for path in sources(root, "engine"):
        if os.path.basename(path) in ENGINE_OWN:
            continue
        text = open(path, encoding="utf-8").read()
        for m in PROJECT.finditer(text):
            header = f"{m.group(1)}/{m.group(2)}"
            if header in ENGINE_TOP:
                broken.append(f"{os.path.relpath(path, root)}: includes {header}, the engine "
                              "above its parts (only " + ", ".join(sorted(ENGINE_OWN)) + " may)")
    return broken


# The Python package (docs/architecture.md): public faces at the top (__init__, __main__ the
# launcher, DeepSpeed's and torch's module names, DeepSpeed's subpackages, the front-ends in
# integrations/), the implementation in _-prefixed rooms below them, each room importing only
# those listed under it. A room never imports a face; a face may import any room.
PUBLIC_MODULES = {"__init__", "__main__", "comm", "zero", "pipelining", "pipe", "constants",
                  "checkpointing"}
PUBLIC_PACKAGES = {"accelerator", "checkpoint", "compression", "inference", "integrations",
                   "launcher", "moe", "ops", "runtime", "sequence", "utils"}
ROOMS = {  # room: the rooms it may import
    "_common": set(),
    "_checkpoint": {"_common"},
    "_activations": {"_common"},
    "_parallel": {"_common", "_activations"},
    "_sequence": {"_common", "_activations"},
    "_experts": {"_common", "_activations", "_parallel"},
    "_engine": {"_common", "_checkpoint", "_activations", "_parallel", "_sequence", "_experts"},
    "_tools": {"_common", "_checkpoint", "_activations", "_parallel", "_sequence", "_experts",
               "_engine"},
}
PY_PLAIN_IMPORT = re.compile(r"^\s*import zeroshard\.([\w.]+)", re.M)  # import zeroshard.a.b
EXTENSION = {"_zeroshard", "_build_info"}  # the C++ extension and the build's record: below all
MOST_MODULES = 15  # a folder holding more is split by concern
PY_IMPORT = re.compile(r"^\s*from (\.+|zeroshard\.?)([\w.]*) import (?:\(([^)]*)\)|([\w, ]+))",
                       re.M)


def package_modules(package):
    """{dotted name inside the package (a/b for a/b.py, a/__init__ for a package): path}"""
    found = {}
    for folder, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), package)[:-3]
                found[rel.replace(os.sep, "/")] = os.path.join(folder, f)
    return found


def package_imports(package):
    """{module: set of the package's modules it imports}, lazy imports inside functions too;
    relative imports resolved from the module's own folder, absolute ones (zeroshard.x) from
    the top. The C++ extension counts as a module at the top."""
    modules = package_modules(package)
    known = set(modules) | EXTENSION
    graph = {}
    for m, path in modules.items():
        text = re.sub(r"#.*", "", open(path, encoding="utf-8").read())
        text = re.sub(r'"""(.|\n)*?"""', "", text)  # examples in docstrings are no imports
        here = m.split("/")[:-1]  # the module's package, as path parts
        deps = set()
        found_imports = PY_IMPORT.findall(text) + [
            ("zeroshard.", parts.rsplit(".", 1)[0] if "." in parts else "",
             "", parts.rsplit(".", 1)[-1]) for parts in PY_PLAIN_IMPORT.findall(text)]
        for dots, source, wrapped, names in found_imports:
            names = wrapped or names
            if dots.startswith("zeroshard"):
                base = []
            else:
                base = here[:len(here) - (len(dots) - 1)] if len(dots) > 1 else here
            target = base + (source.split(".") if source else [])
            names = [n.split()[0] for n in names.split(",") if n.split()]  # "a as b" -> a
            found = False
            for parts in [target + [n] for n in names]:  # from .a import b: b a module of a
                for name in ("/".join(parts), "/".join(parts + ["__init__"])):
                    if name in known and name != m:
                        deps.add(name)
                        found = True
            if source and not found:
                for name in ("/".join(target), "/".join(target + ["__init__"])):
                    if name in known and name != m:
                        deps.add(name)
        graph[m] = deps
    return graph


def cycle_from(graph, start):
    """A path start -> ... -> start, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return path + [start]
            if nxt not in seen and nxt in graph:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def room_of(module):
    """The room a module is in, "" for a face, or None for the extension."""
    top = module.split("/")[0]
    if top in EXTENSION:
        return None
    return top if top in ROOMS else ""


def check_python(root):
    package = os.path.join(root, "bindings", "zeroshard")
    graph = package_imports(package)
    where = "bindings/zeroshard"
    broken = []
    for m in sorted(graph):
        top = m.split("/")[0]
        if "/" not in m and m not in PUBLIC_MODULES and m not in EXTENSION:
            broken.append(f"{where}/{m}.py: a module at the top that is no public face; the "
                          f"top holds {', '.join(sorted(PUBLIC_MODULES))} and folders (the rooms "
                          f"{', '.join(ROOMS)}; the public packages {', '.join(sorted(PUBLIC_PACKAGES))})")
        elif "/" in m and top not in ROOMS and top not in PUBLIC_PACKAGES:
            broken.append(f"{where}/{top}/: a folder that is neither a room ({', '.join(ROOMS)}) "
                          f"nor a public package ({', '.join(sorted(PUBLIC_PACKAGES))})")
        room = room_of(m)
        if not room:
            continue
        for dep in sorted(graph[m]):
            other = room_of(dep)
            if other is None or other == room or other in ROOMS[room]:
                continue
            said = "a public face" if other == "" else f"the room {other}"
            broken.append(f"{where}/{m}.py: imports {dep} ({said}), above the room {room} "
                          f"(it may import {', '.join(sorted(ROOMS[room])) or 'only the extension'})")
    folders = {}
    for m in graph:
        if "/" in m and not m.endswith("__init__"):
            folders.setdefault(m.rsplit("/", 1)[0], []).append(m)
    for folder, held in sorted(folders.items()):
        if len(held) > MOST_MODULES:
            broken.append(f"{where}/{folder}/: {len(held)} modules, more than {MOST_MODULES}; "
                          "split it by concern")
    # A package's __init__ may import its own modules, and each of them its packages'
    # __init__s (Python allows that shape); every other cycle is a defect.
    def enclosing_inits(m):
        parts = m.split("/")[:-1]
        return {"/".join(parts[:n] + ["__init__"]) for n in range(len(parts) + 1)}

    acyclic = {k: v - enclosing_inits(k) for k, v in graph.items()}
    reported = set()
    for m in sorted(graph):
        cycle = cycle_from(acyclic, m)
        if cycle and frozenset(cycle) not in reported:
            reported.add(frozenset(cycle))
            broken.append("bindings/zeroshard: import cycle " + " -> ".join(cycle))
    return broken


def main():
    broken = check(sys.argv[1]) + check_engine(sys.argv[1]) + check_python(sys.argv[1])
    for line in broken:
        print(line)
    print(f"layering: {len(broken)} include(s) or import(s) against the layers")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
