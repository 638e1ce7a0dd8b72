"""Cold start of README's command against the same venv's bare interpreter (issue 23, item 8).

    python benchmarks/startup.py [--runs 15] [--exe PATH/TO/fitcheck]

Measures what a user installing as README says gets: the ``fitcheck`` console script on PATH
(``pip install .``, not editable) running ``fitcheck --params 13e9 --gpu h100-80 --n 8``,
against ``python -c pass`` of the interpreter that script runs under (its ``#!`` line: the
same virtual environment, the same site-packages and .pth files). The two run alternately
(A B A B ...) so drift hits both; it prints each one's median wall time, the median of the
per-pair ratios (target: <= 50 ms, <= 5x; goal 3x) and ``-X importtime``'s heaviest imports
of the command under that interpreter. Quote it from an idle machine: on a loaded one every
figure grows, the ratio too.

Where the time goes (2026-11-26: CPython 3.11.7, click 8.5.1, a fresh ``pip install .`` venv;
each row a fresh interpreter with the collector off as planner/console.py runs it, median of 21
alternated runs, and what it adds to the row above):

    python -c pass                                                      11.5 ms
    + the standard library the planner imports itself (typing, enum,   +22.3
      re, json, tomllib, dataclasses and its inspect, textwrap, signal)
    + what only click imports (uuid and platform, datetime, gettext     +4.3
      and locale, threading)
    + click's own modules                                               +6.0
    + planner.cli (fields, spec's enums, error_bands; 95 options built) +8.1
    + the command's other modules (plan, memory, request, render,      +11.4
      hardware, calibration, ...)
    + running it: parse, request, plan (16 memory and 11 step          +15.8
      estimates), table, exit
    = the command                                                       79.6 ms (6.9x)

Its imports alone are 5.5x. What was tried:

* kept: the cyclic garbage collector off for a plan and frozen at exit (planner/console.py):
  92 -> 78 ms.
* not kept: deferring click's unused standard-library modules with
  ``importlib.util.LazyLoader``. click 8.5.1 reads them while it is imported (click/types.py:
  ``ParamType[uuid.UUID]``, ``from datetime import datetime``), every ``click.Option`` with a
  help text calls ``inspect.cleandoc`` and ``dataclasses`` imports ``inspect`` too, and
  CPython loads a lazy module whenever it is imported a second time (it reads ``__spec__``:
  python/cpython#127036).
* not changed: the plan's arithmetic. Its cost is spread over 27 estimates; its busiest
  helpers (``vec._scalar``, ``Breakdown.plus``) cost under 0.5 ms each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ARGS = ["--params", "13e9", "--gpu", "h100-80", "--n", "8"]
TARGET_MS, TARGET_RATIO, GOAL_RATIO = 50, 5, 3

# As a user runs it: bytecode cached (some shells here set PYTHONDONTWRITEBYTECODE=1, which
# would recompile the project's modules on every call).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
    return time.perf_counter() - t0


def interpreter_of(script: str) -> str:
    """The interpreter a console script runs under: its ``#!`` line (pip writes the venv's)."""
    with open(script, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    if not first.startswith("#!") or len(first.split()) != 1:
        sys.exit(f"{script}: no plain '#!interpreter' line; pass --exe a pip-installed script")
    return first[2:]


def heaviest_imports(python: str, n: int = 10) -> list[tuple[int, str]]:
    """``-X importtime`` of the command in ``python``: the top-level imports by cumulative us."""
    code = (f"import sys; sys.argv = ['fitcheck', *{ARGS!r}]\n"
            "from planner.console import main\ntry: main()\nexcept SystemExit: pass")
    err = subprocess.run([python, "-X", "importtime", "-c", code], capture_output=True,
                         text=True, env=ENV, cwd=tempfile.gettempdir()).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cum, name = line.split("|")
            # top level: one space after the bar (nested imports are indented further)
            if cum.strip().isdigit() and not name.startswith("  "):
                rows.append((int(cum), name.strip()))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15, help="paired runs (default 15)")
    ap.add_argument("--exe", default=shutil.which("fitcheck"),
                    help="the console script (default: fitcheck on PATH)")
    args = ap.parse_args()
    if args.exe is None:
        sys.exit("fitcheck is not on PATH: pip install . first (as README says)")
    python = interpreter_of(args.exe)
    cmd, base = [args.exe, *ARGS], [python, "-c", "pass"]
    wall(cmd), wall(base)  # warm the page cache and write the .pyc files
    pairs = [(wall(cmd), wall(base)) for _ in range(args.runs)]
    a = statistics.median(p[0] for p in pairs) * 1e3
    b = statistics.median(p[1] for p in pairs) * 1e3
    r = statistics.median(p[0] / p[1] for p in pairs)
    print(f"{args.exe} {' '.join(ARGS)}: median {a:.1f} ms (target <= {TARGET_MS} ms)")
    print(f"{python} -c pass: median {b:.1f} ms")
    print(f"ratio, median of {args.runs} paired runs: {r:.2f}x "
          f"(target <= {TARGET_RATIO}x, goal {GOAL_RATIO}x)")
    print("heaviest top-level imports of the command (-X importtime, cumulative us):")
    for cum, name in heaviest_imports(python):
        print(f"  {cum:8d}  {name}")


if __name__ == "__main__":
    main()
