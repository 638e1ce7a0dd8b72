"""Capacity-planning reports (``fitcheck report``, docs/reports.md).

Sweep models x GPU types x GPU counts (x seq x micro-batch) x strategies x checkpointing,
planning every configuration as `fitcheck plan` does, then write tables and plots:

- ``request``: the report's request, parsed from the command line; the plan's request of each
  model on each GPU type is ``planner.request.build_request``'s
- ``sweep``: every configuration planned by ``planner.plan``'s rules on numpy arrays (the
  candidates, memory, fit, step time, the recommendation, the fewest GPUs); the numbers are
  the planner's own (``planner.memory``, ``planner.throughput``)
- ``tables``: Markdown tables; ``plots``: matplotlib figures; ``html``: one self-contained page
- ``write``: one class per output file, written all-or-nothing
- ``cli``: the ``fitcheck report`` command

pandas (tables) and matplotlib (plots) are imported only here, and matplotlib only when a plot
is asked for; the planning fast path never imports this package.
"""

from planner.report.request import ReportRequest, build_request
from planner.report.sweep import COLUMNS, Report, run_sweep
from planner.report.write import FORMATS, Written, check_formats, parse_formats, write_report

__all__ = ["COLUMNS", "FORMATS", "Report", "ReportRequest", "Written", "build_request",
           "check_formats", "parse_formats", "run_sweep", "write_report"]
