"""``python -m planner`` is ``fitcheck``."""

from planner.console import main

main()
