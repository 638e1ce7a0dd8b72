__version__ = "0.1.0"
DISTRIBUTION = "fitcheck-planner"
"""The name this project is installed under (`pip install fitcheck-planner`): the PyPI name
`fitcheck` belongs to an unrelated project. The command is `fitcheck`."""
