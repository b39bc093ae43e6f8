"""Console commands of an installed zeroshard (pyproject.toml's [project.scripts])."""
import os
import sys


def estimate():
    """zeroshard-estimate: the C++ estimator carried inside the package (zeroshard/bin)."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "zeroshard-estimate")
    os.execv(exe, [exe] + sys.argv[1:])
