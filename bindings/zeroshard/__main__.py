"""`python -m zeroshard ...`: the `zeroshard` launcher (zeroshard/_launcher.py)."""
import sys

from ._launcher import main

sys.exit(main())
