"""The layers hold: no file includes a header of a layer above its own, and the planning
layers build without LibTorch (docs/architecture.md). A test: exits 1 naming each
include that breaks a rule.
usage: layering_check.py SOURCE_DIR"""
import os
import re
import sys

# What each folder may include, besides itself.
BELOW = {
    "common": set(),
    "config": {"common"},
    "plan": {"common", "config"},
    "sharding": {"common"},
    "offload": {"common"},
    "engine": {"common", "config", "plan", "sharding", "offload"},
    "bindings": {"common", "config", "plan", "sharding", "offload", "engine"},
    "tools": {"common", "config", "plan", "sharding", "offload", "engine"},
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
            allowed = below | {folder} | ({"tests", "tools"} if in_tests else set())
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


def main():
    broken = check(sys.argv[1])
    for line in broken:
        print(line)
    print(f"layering: {len(broken)} include(s) against the layers")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
