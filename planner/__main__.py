"""``python -m planner`` is ``fitcheck``."""

from planner.cli import main

main()
