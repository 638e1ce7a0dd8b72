"""How long the mesh search takes (issue 26, item 7: `--mesh auto` must not push
`fitcheck --model llama3.1-405b --gpu h100-80 --n 512` past 1 s), and a check that a faster
search gives the same answers.

    python benchmarks/mesh_search.py [--runs 5]
    python benchmarks/mesh_search.py --record DIR    # on the code before a change
    python benchmarks/mesh_search.py --compare DIR   # on the code after it

Prints, as medians of ``--runs`` runs, the wall seconds of the command as a user runs it
(a fresh interpreter: ``python -m planner ...`` in the current directory), with and without
``--mesh auto``, and of the search alone in this process (``planner.mesh.search``, imports
warm; the pipeline rank states kept between plans cleared before each run, as a fresh
process starts without them), with the number of layouts it planned. The cold runs also
print their CPU seconds (user + system), which a loaded machine inflates far less than the
wall time. Quote it from an idle machine: on a loaded one every figure grows; compare two
versions in the same minute.

``--record DIR`` writes the text and ``--json`` output (and exit status) of every command of
``CORPUS`` to DIR; ``--compare DIR`` runs them again and names each output that is not
byte-identical (exit 1 if any). Run both from the checkout under test (``python -m planner``
resolves in the current directory).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

ARGS = ["--model", "llama3.1-405b", "--gpu", "h100-80", "--n", "512"]
VALUES = {"model.preset": "llama3.1-405b", "hardware.gpu": "h100-80", "hardware.n": 512}
LIMIT_S = 1.0

CORPUS = [
    # the command of the limit, and beside it the plain plan
    [*ARGS, "--mesh", "auto"], ARGS,
    ["--model", "llama3.1-70b", "--gpu", "h100-80", "--n", "64", "--mesh", "auto"],
    ["--model", "llama3.1-70b", "--gpu", "h100-80", "--n", "64"],
    # an MoE model: expert-parallel layouts; a given EP
    ["--model", "mixtral-8x7b", "--gpu", "h100-80", "--n", "32", "--mesh", "auto"],
    ["--model", "mixtral-8x7b", "--gpu", "h100-80", "--n", "32", "--ep", "8"],
    ["--model", "qwen3-30b-a3b", "--gpu", "h100-80", "--n", "64", "--mesh", "auto"],
    ["--model", "llama3.1-8b", "--gpu", "h100-80", "--n", "8", "--mesh", "auto"],
    ["--model", "llama3.1-8b", "--gpu", "h100-80", "--n", "8"],
    # long sequences: context parallel chosen or given
    ["--model", "llama3.1-70b", "--gpu", "h100-80", "--n", "64", "--seq", "131072", "--mesh",
     "auto"],
    ["--model", "llama3.1-70b", "--gpu", "h100-80", "--n", "64", "--seq", "32768", "--cp", "4"],
    ["--model", "llama3.1-8b", "--gpu", "a100-40", "--n", "16", "--seq", "65536", "--mesh",
     "auto"],
    ["--model", "llama3.1-405b", "--gpu", "h100-80", "--n", "128", "--seq", "8192", "--mesh",
     "auto"],
    ["--model", "llama3.1-70b", "--gpu", "a100-80", "--n", "32", "--seq", "4096",
     "--micro-batch", "2", "--mesh", "auto"],
    # a count that is not a power of two: odd pipeline depths
    ["--model", "llama3.1-405b", "--gpu", "h100-80", "--n", "24", "--mesh", "auto"],
]
"""Commands whose output a faster search must leave byte-identical (each also with --json)."""


def cold_s(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one fresh ``python -m planner``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "planner", *args], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def outputs() -> dict[str, bytes]:
    """{file name: stdout + stderr + exit status} of every CORPUS command, text and --json."""
    out = {}
    for i, args in enumerate(CORPUS, 1):
        for suffix, more in (("txt", []), ("json", ["--json"])):
            r = subprocess.run([sys.executable, "-m", "planner", *args, *more], check=False,
                               capture_output=True)
            out[f"{i:02d}.{suffix}"] = (" ".join(args).encode() + b"\n" + r.stdout + r.stderr
                                        + f"\nexit {r.returncode}\n".encode())
    return out


def record(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for name, data in outputs().items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    print(f"{len(CORPUS)} commands x (text, --json) written to {folder}")


def compare(folder: str) -> int:
    differ = []
    for name, data in outputs().items():
        with open(os.path.join(folder, name), "rb") as f:
            if f.read() != data:
                differ.append(name)
    print(f"{2 * len(CORPUS) - len(differ)} of {2 * len(CORPUS)} outputs byte-identical to "
          f"{folder}" + (f"; differ: {', '.join(differ)}" if differ else ""))
    return 1 if differ else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--record", metavar="DIR")
    ap.add_argument("--compare", metavar="DIR")
    a = ap.parse_args()
    if a.record:
        record(a.record)
        return
    if a.compare:
        sys.exit(compare(a.compare))
    from planner.mesh import search

    try:
        from planner.memory.pipeline import clear_caches
    except ImportError:  # a version before these caches (the script times it too)
        clear_caches = None

    search(VALUES)  # warm the imports and caches
    warm, tried = [], 0
    for _ in range(a.runs):
        if clear_caches is not None:
            clear_caches()  # a fresh process has none of the rank states kept between plans
        t = time.perf_counter()
        tried = len(search(VALUES).tried)
        warm.append(time.perf_counter() - t)
    plain, plain_cpu = medians([cold_s(ARGS) for _ in range(a.runs)])
    mesh, mesh_cpu = medians([cold_s([*ARGS, "--mesh", "auto"]) for _ in range(a.runs)])
    print(f"fitcheck {' '.join(ARGS)}:              {plain:.3f} s (cold, median of {a.runs}; "
          f"CPU {plain_cpu:.3f} s)")
    print(f"fitcheck {' '.join(ARGS)} --mesh auto:  {mesh:.3f} s (cold, median of {a.runs}; "
          f"CPU {mesh_cpu:.3f} s; limit {LIMIT_S:.0f} s)")
    print(f"planner.mesh.search alone: {statistics.median(warm):.3f} s warm, {tried} layouts")


if __name__ == "__main__":
    main()
