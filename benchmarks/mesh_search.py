"""How long the mesh search takes (issue 26, item 7: `--mesh auto` must not push
`fitcheck --model llama3.1-405b --gpu h100-80 --n 512` past 1 s).

    python benchmarks/mesh_search.py [--runs 5]

Prints, as medians of ``--runs`` runs, the wall seconds of the command as a user runs it
(a fresh interpreter: ``python -m planner ...``), with and without ``--mesh auto``, and of
the search alone in this process (``planner.mesh.search``, imports warm), with the number of
layouts it planned. Quote it from an idle machine: on a loaded one every figure grows.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ARGS = ["--model", "llama3.1-405b", "--gpu", "h100-80", "--n", "512"]
VALUES = {"model.preset": "llama3.1-405b", "hardware.gpu": "h100-80", "hardware.n": 512}
LIMIT_S = 1.0


def cold_s(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "planner", *args], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    from planner.mesh import search

    search(VALUES)  # warm the imports and caches
    warm, tried = [], 0
    for _ in range(runs):
        t = time.perf_counter()
        tried = len(search(VALUES).tried)
        warm.append(time.perf_counter() - t)
    plain = statistics.median(cold_s(ARGS) for _ in range(runs))
    mesh = statistics.median(cold_s([*ARGS, "--mesh", "auto"]) for _ in range(runs))
    print(f"fitcheck {' '.join(ARGS)}:              {plain:.3f} s (cold, median of {runs})")
    print(f"fitcheck {' '.join(ARGS)} --mesh auto:  {mesh:.3f} s (cold, median of {runs}; "
          f"limit {LIMIT_S:.0f} s)")
    print(f"planner.mesh.search alone: {statistics.median(warm):.3f} s warm, {tried} layouts")


if __name__ == "__main__":
    main()
