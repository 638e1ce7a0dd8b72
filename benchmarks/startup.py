"""Cold wall time of the main command as a ratio to `python -c pass` (target <= 3x).

    python benchmarks/startup.py [--runs 21]

Runs the two commands alternately (A B A B ...) so drift hits both, and prints each one's
median wall time and the median of the per-pair ratios. Also prints `python -X importtime`'s
heaviest imports of the command, to show where the time goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time


# As a user runs it: bytecode cached (some shells here set PYTHONDONTWRITEBYTECODE=1, which
# would recompile the project's modules on every call).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    args = ap.parse_args()
    exe = shutil.which("fitcheck")
    if exe is None:
        sys.exit("fitcheck is not on PATH: pip install -e . first")
    cmd = [exe, "--params", "13e9", "--gpu", "h100-80", "--n", "8"]
    base = [sys.executable, "-c", "pass"]
    wall(cmd), wall(base)  # warm the page cache and write the .pyc files
    pairs = [(wall(cmd), wall(base)) for _ in range(args.runs)]
    a = statistics.median(p[0] for p in pairs)
    b = statistics.median(p[1] for p in pairs)
    r = statistics.median(p[0] / p[1] for p in pairs)
    print(f"fitcheck --params 13e9 --gpu h100-80 --n 8: median {a * 1e3:.1f} ms")
    print(f"python -c pass:                              median {b * 1e3:.1f} ms")
    print(f"ratio (median of {args.runs} paired runs):   {r:.2f}x  (target <= 3x)")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c",
                          "from planner.cli import cli\n"
                          "try: cli.main(['--params','13e9','--gpu','h100-80','--n','8'])\n"
                          "except SystemExit: pass"],
                         capture_output=True, text=True, env=ENV).stderr
    rows = []
    for line in out.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cum, name = line.split("|")
            if cum.strip().isdigit():
                rows.append((int(cum), name.rstrip()))
    print("heaviest top-level imports (cumulative us):")
    for cum, name in sorted(r for r in rows if not r[1].startswith("  ") or r[1].startswith("  ") and r[1][2] != " ")[-8:][::-1]:
        print(f"  {cum:8d}  {name.strip()}")


if __name__ == "__main__":
    main()
