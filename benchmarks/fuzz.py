"""Fuzz and metamorphic counts: the properties of tests/test_fuzz.py, run with many examples.

    python benchmarks/fuzz.py [--cli 4000] [--specs 4000] [--metamorphic 2000] [--minima 1000]

Prints, for generated command lines and gate specs, how many runs ended in each exit code and
how many broke the contract (exit 1, a traceback, more than one line on stderr for a usage or
data error, an internal error in a gate verdict); and for generated plans, how many runs broke
each metamorphic property; for generated `--find min-gpus` requests (MoE and dense, node sizes,
offload, host RAM), how many found minima are the first count that fits, within a node and
past one, against a plan of every count up to 256 GPUs (tests/test_min_gpus.py's oracle).
Needs hypothesis (the test extra).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402

import test_fuzz as T  # noqa: E402
import test_min_gpus as M  # noqa: E402
from conftest import run  # noqa: E402
from fuzz_cases import command_lines, min_gpus_requests, plans, specs  # noqa: E402
from planner.errors import FitcheckError  # noqa: E402
from planner.fields import SPEC  # noqa: E402
from planner.plan import min_gpus  # noqa: E402
from planner.request import build_request  # noqa: E402


def counted(n: int, strategy, body) -> tuple[collections.Counter, float]:
    out: collections.Counter = collections.Counter()

    @settings(max_examples=n, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def loop(x):
        out[body(x)] += 1

    t = time.perf_counter()
    loop()
    return out, time.perf_counter() - t


def cli_case(args) -> str:
    r = run(*args)
    try:
        T.check_cli_result(r)
    except AssertionError:
        return f"VIOLATION exit {r.exit_code}"
    return f"exit {r.exit_code}"


def spec_case(spec) -> str:
    r = run("gate", "-", "--on-error", "admit", input=json.dumps(spec))
    try:
        T.check_cli_result(r)
        if r.exit_code == 0 and "error" in json.loads(r.stdout):
            return "VIOLATION admitted on an internal error"
    except AssertionError:
        return f"VIOLATION exit {r.exit_code}"
    return f"exit {r.exit_code}"


def property_case(fn):
    def body(values) -> str:
        try:
            fn.hypothesis.inner_test(values)
        except AssertionError:
            return "VIOLATION"
        return "ok"
    return body


def minimum_case(values) -> str:
    """A found minimum against the oracle: the first of every count, planned one by one."""
    try:
        r = build_request(values, SPEC)
    except FitcheckError:
        return "refused (e.g. TP over experts)"
    try:
        M.check_minimal(r)
    except AssertionError:
        return "VIOLATION not the first count that fits"
    n = min_gpus(r)
    if n is None or n > M.ORACLE_LIMIT:
        return f"none up to {M.ORACLE_LIMIT}"
    return "minimal, past a node" if n > r.cluster.gpus_per_node else "minimal, within a node"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", type=int, default=4000)
    ap.add_argument("--specs", type=int, default=4000)
    ap.add_argument("--metamorphic", type=int, default=2000, help="runs per property")
    ap.add_argument("--minima", type=int, default=1000, help="`--find min-gpus` requests")
    args = ap.parse_args(argv)
    total_bad = 0
    for title, n, strategy, body in [
        ("command lines", args.cli, command_lines(), cli_case),
        ("gate specs (--on-error admit)", args.specs, specs(), spec_case),
        ("more GPUs never need more memory", args.metamorphic, plans(),
         property_case(T.test_more_gpus_in_a_node_never_need_more_memory)),
        ("more tokens never need less memory", args.metamorphic, plans(),
         property_case(T.test_more_tokens_never_need_less_memory)),
        ("found values fit", args.metamorphic // 4, plans(),
         property_case(T.test_found_values_fit)),
        ("found minima are minimal", args.minima, min_gpus_requests(), minimum_case),
    ]:
        if n <= 0:
            continue
        counts, secs = counted(n, strategy, body)
        bad = sum(v for k, v in counts.items() if k.startswith("VIOLATION"))
        total_bad += bad
        print(f"{title}: {sum(counts.values())} runs in {secs:.0f} s, {bad} violations; "
              + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 1 if total_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
