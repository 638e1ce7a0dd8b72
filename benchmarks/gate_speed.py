"""How fast `fitcheck gate` answers (target: well under 100 ms of work beyond interpreter start).

    python benchmarks/gate_speed.py [--runs 21] [--spec tests/data/gate/llama8b-8xh100.json]

1. In process: the median time of reading, validating and gating the example spec (imports
   done once, before timing), and the same for a spec that is rejected (which also searches
   the fewest GPUs that would fit).
2. Cold: `fitcheck gate SPEC` wall time against `python -c pass`, run alternately
   (A B A B ...), with the median of each and of the per-pair ratios; the difference is the
   command's whole cost beyond interpreter start (imports included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "tests" / "data" / "gate" / "llama8b-8xh100.json"
REJECTED = {"model": {"preset": "llama3-70b"}, "training": {"seq": 8192},
            "hardware": {"gpu": "h100-80", "n": 8}, "strategy": "ddp"}
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def in_process(spec_path: str, runs: int) -> float:
    from planner.gate import gate, read_spec

    def once() -> float:
        t0 = time.perf_counter()
        doc, base = read_spec(spec_path)
        v = gate(doc, base_dir=base)
        json.dumps(v)
        return time.perf_counter() - t0

    once()  # imports and first-call caches out of the measurement
    return statistics.median(once() for _ in range(runs))


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--spec", default=str(DEFAULT_SPEC))
    args = ap.parse_args()

    admit = in_process(args.spec, args.runs)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(REJECTED, f)
        rejected_path = f.name
    try:
        reject = in_process(rejected_path, args.runs)
    finally:
        os.unlink(rejected_path)
    print(f"in process, admit  ({Path(args.spec).name}): median {admit * 1e3:.2f} ms")
    print(f"in process, reject (llama3-70b ddp pinned, 8 x h100-80): median {reject * 1e3:.2f} ms")

    exe = shutil.which("fitcheck")
    cmd = [exe, "gate", args.spec] if exe else [
        sys.executable, "-c", "from planner.cli import main; main()", "gate", args.spec]
    base = [sys.executable, "-c", "pass"]
    wall(cmd), wall(base)  # warm the page cache and write the .pyc files
    pairs = [(wall(cmd), wall(base)) for _ in range(args.runs)]
    a = statistics.median(p[0] for p in pairs)
    b = statistics.median(p[1] for p in pairs)
    r = statistics.median(p[0] / p[1] for p in pairs)
    print(f"cold `fitcheck gate SPEC`: median {a * 1e3:.1f} ms")
    print(f"cold `python -c pass`:     median {b * 1e3:.1f} ms")
    print(f"ratio (median of {args.runs} paired runs): {r:.2f}x; beyond interpreter start: "
          f"{(a - b) * 1e3:.1f} ms (target well under 100 ms)")


if __name__ == "__main__":
    main()
