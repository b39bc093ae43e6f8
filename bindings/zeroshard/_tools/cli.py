"""Console commands of an installed zeroshard (pyproject.toml's [project.scripts])."""
import os
import sys


def estimate():
    """zeroshard-estimate: the C++ estimator carried inside the package (zeroshard/bin)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.join(package, "bin", "zeroshard-estimate")
    os.execv(exe, [exe] + sys.argv[1:])
