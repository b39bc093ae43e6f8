"""`python -m zeroshard ...`: the `zeroshard` launcher (zeroshard/_launcher.py)."""
import sys

from ._tools.launcher import main

sys.exit(main())
