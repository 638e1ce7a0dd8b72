"""Time a ~10,000-configuration `fitcheck report` (target: <= 5 s for CSV + Markdown).

    python benchmarks/report_speed.py [--repeat 3] [--no-plots] [--no-cli]

Sweeps 4 models x 4 GPU types x 7 GPU counts x 2 sequence lengths x 2 micro-batches x
8 strategies x 3 checkpointing modes (10,752 configurations, plus the tensor-parallel and
offload rows the plan adds where nothing else fits) and prints, best of --repeat in-process
runs (and configurations/s):

  csv+md      the sweep (planner.plan's rules over every configuration on arrays: memory,
              step time, the recommendation, the min-GPU searches) and report.csv/report.md
  html+png    the same plus the four plots, the PNG files and the self-contained HTML
              (needs matplotlib)

and the wall time of one `fitcheck report` process (imports included) for each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.report import build_request, write_report  # noqa: E402
from planner.report.plots import have_matplotlib  # noqa: E402

ARGS = dict(
    models="llama3-8b,llama2-13b,llama3-70b,llama3.1-405b",
    gpus="a100-80,h100-80,h200,mi300x",
    ns="8,16,32,64,128,256,512",
    seqs="2048,8192",
    micro_batches="1,2",
    prices="1.8,2.5,3.5,2.8",
)
TARGET_S = 5.0


def cli_args(out: str, formats: str) -> list[str]:
    return [sys.executable, "-c", "from planner.cli import main; main()", "report",
            "--models", ARGS["models"], "--gpus", ARGS["gpus"], "--n", ARGS["ns"], "--seq", ARGS["seqs"],
            "--micro-batch", ARGS["micro_batches"], "--price-per-gpu-hour", ARGS["prices"],
            "--out", out, "--format", formats, "--no-progress"]


def timed(formats: tuple[str, ...], repeat: int) -> tuple[float, int, dict[str, float]]:
    best, rows, parts = float("inf"), 0, {}
    for _ in range(repeat):
        req = build_request(**ARGS)
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            written = write_report(req, d, formats)
            dt = time.perf_counter() - t
        if dt < best:
            best, rows, parts = dt, len(written.report.rows), written.timings
    return best, rows, parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-plots", action="store_true", help="skip the HTML/plots timing")
    ap.add_argument("--no-cli", action="store_true", help="skip the `fitcheck report` process")
    args = ap.parse_args(argv)

    runs = [("csv+md", ("csv", "md"))]
    if not args.no_plots:
        if have_matplotlib():
            runs.append(("csv+md+html+png", ("csv", "md", "html", "png")))
        else:
            print("matplotlib not installed: HTML/plot timing skipped")
    ok = True
    for name, formats in runs:
        best, rows, parts = timed(formats, args.repeat)
        detail = ", ".join(f"{k} {v:.2f} s" for k, v in parts.items())
        print(f"{name:16s} {rows} configurations: {best:.2f} s = {rows / best:,.0f} "
              f"configurations/s (best of {args.repeat}; {detail})")
        if name == "csv+md":
            ok = best <= TARGET_S
        if not args.no_cli:
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, PYTHONPATH=str(ROOT))
                t = time.perf_counter()
                subprocess.run(cli_args(d, ",".join(formats)), check=True, env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL)
                print(f"{'':16s} `fitcheck report --format {','.join(formats)}` process: "
                      f"{time.perf_counter() - t:.2f} s wall (imports included)")
    print(f"target: csv+md <= {TARGET_S:.0f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
