"""What a user's runs leave behind, read and compared with the planner (docs/explain.md).

- ``units``: byte counts as tools print them, with their rounding
- ``evidence``: the typed evidence (OOM events, log samples, snapshot summaries, a run)
- ``oom``: CUDA/HIP out-of-memory messages of every release, and the traceback's moment
- ``logs``: training-log memory and speed lines, one reader per tool
- ``snapshot``: ``_dump_snapshot`` pickles, read as plain data only, replayed and attributed
- ``records``: fitcheck's own probe and GPU-run records, which carry their jobs
- ``read``: a file's kind by its content
- ``explain``: prediction beside measurement, what broke the limit, what fits instead
- ``render``: text and JSON
- ``fit``, ``manifest``: calibration from runs, held-out error

The core of the planner: no click, no front end, no probes; standard library only.
"""
