"""Moved: the wrapper is planner/slurm.py, installed as the `fitcheck-sbatch` console script.

This shim keeps `import fitcheck_slurm` (and `python fitcheck_slurm.py ...`) working from a
checkout where fitcheck is not installed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))

from planner.slurm import *  # noqa: E402,F401,F403
from planner.slurm import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
