"""The ``fitcheck`` console script (pyproject.toml) and ``python -m planner``: ``planner.cli``'s
``main`` with the cyclic garbage collector off, for one short command (issue 23, item 8).

The collector walks every tracked object each time allocations pass its threshold; importing
click and the planner makes tens of thousands (classes, functions, dictionaries), so it ran
several times during ``fitcheck --params 13e9 --gpu h100-80 --n 8``, and once more over
everything at exit: 13 ms of a 93 ms command (benchmarks/startup.py). A plan makes no
reference cycles that need collecting before the process ends. So ``main`` switches the
collector off before the first import (``gc.disable``) and, at the end, freezes what is still
alive (``gc.freeze``: the interpreter's collections at shutdown skip it; the memory goes back
to the operating system with the process, and every ``finally`` block, atexit handler and
stream flush still runs). The commands that run long or allocate a lot (every subcommand but
``plan``, and ``--from-trace``) switch it back on first (planner/cli.py ``_collector_on``).
Imported as a library (tests, ``from planner.cli import main``), nothing here runs.
"""

from __future__ import annotations

import gc


def main() -> None:
    gc.disable()
    try:
        from planner.cli import main as cli_main  # imports click and the planner

        cli_main()
    finally:
        gc.freeze()
