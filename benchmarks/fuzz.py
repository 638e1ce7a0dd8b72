"""Fuzz and metamorphic counts: the properties of tests/test_fuzz.py, run with many examples.

    python benchmarks/fuzz.py [--cli 4000] [--specs 4000] [--metamorphic 2000] [--minima 1000]
                              [--bytes 2000] [--reviews 2000] [--timeouts 500] [--sizes 200]

Prints, for generated command lines and gate specs, how many runs ended in each exit code and
how many broke the contract (exit 1, a traceback, more than one line on stderr for a usage or
data error, an internal error in a gate verdict); and for generated plans, how many runs broke
each metamorphic property; for generated `--find min-gpus` requests (MoE and dense, node sizes,
offload, host RAM), how many found minima are the first count that fits, within a node and
past one, against a plan of every count up to 256 GPUs (tests/test_min_gpus.py's oracle).
Issue 22's inputs: spec and job file bytes (control characters, non-UTF-8, NUL, NaN, 4,400-digit
integers, 110,000 documents) through `gate FILE`, `gate -` and `--job` under --on-error admit;
AdmissionReviews with bad GPU counts and replica bombs through the webhook's evaluation (an
exception there is the --on-error answer: admitted under admit); `fitcheck-sbatch
--fitcheck-timeout` values; and estimating a request with one number at its field's largest
against the same request at a small value (a violation: more than 3x the time). A run past 20 s
is a hang. Needs hypothesis (the test extra).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import test_fuzz as T  # noqa: E402
import test_min_gpus as M  # noqa: E402
from conftest import run  # noqa: E402
from fuzz_cases import (  # noqa: E402
    EDGE_NUMBERS, SIZE_FIELDS, command_lines, min_gpus_requests, plans, raw_text,
    reviewed_objects, sized_requests, spec_bytes, specs,
)
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
            fn(values)
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


class Hang(Exception):
    pass


def _deadline(seconds: float, body):
    """``body()``, or Hang past ``seconds`` (SIGALRM: the main thread, POSIX)."""
    def ring(*_):
        raise Hang()
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return body()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _verdict(r) -> str:
    try:
        T.check_cli_result(r)
    except AssertionError:
        raise AssertionError(f"exit {r.exit_code}") from None
    if r.exit_code == 0 and "error" in (json.loads(r.stdout) if r.stdout.startswith("{") else {}):
        raise AssertionError("admitted on an internal error")
    return f"exit {r.exit_code}"


def bytes_case(data: bytes) -> str:
    """The bytes as a gate spec file, on the gate's stdin and as a --job file."""
    suffix = (".toml" if b"[job]" in data else ".json" if data.lstrip(b"\xef\xbb\xbf").startswith(b"{")
              else ".yaml")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "job" + suffix)
        with open(path, "wb") as f:
            f.write(data)
        runs = [("gate", path, "--on-error", "admit"),
                ("--job", path, "--model", "llama3-8b", "--gpu", "h100-80")]
        out = []
        try:
            for args in runs:
                out.append(_deadline(20, lambda: _verdict(run(*args))))
            out.append(_deadline(20, lambda: _verdict(run("gate", "-", "--on-error", "admit",
                                                          input=data))))
        except Hang:
            return "VIOLATION hang"
        except AssertionError as exc:
            return f"VIOLATION {str(exc)[:60]}"
    return "/".join(out)


REVIEW_MEMORY = 128 << 20
"""Bytes one review may allocate (the replica bomb allocated about 1 GiB)."""


def review_case(req: dict) -> str:
    """The webhook's evaluation of one AdmissionReview request, as a worker runs it: an
    exception is the --on-error answer (admitted under admit)."""
    import tracemalloc

    from planner.webhook import WebhookConfig, evaluate

    tracemalloc.start()
    try:
        resp = _deadline(20, lambda: evaluate("u", req, WebhookConfig(on_error="admit")))
        peak = tracemalloc.get_traced_memory()[1]
    except Hang:
        return "VIOLATION hang"
    except Exception as exc:  # noqa: BLE001 - what the fuzzer counts
        return f"VIOLATION internal error ({type(exc).__name__})"
    finally:
        tracemalloc.stop()
    if peak > REVIEW_MEMORY:  # an evaluation process has 512 MiB of address space in all
        return "VIOLATION over 128 MiB allocated"
    r = resp["response"]
    if r["allowed"]:
        return "admitted"
    return "denied: bad spec" if "bad job spec" in r["status"]["message"] else "denied"


def timeout_case(value: str) -> str:
    from planner.slurm import WrapperUsage, parse_argv

    try:
        t = parse_argv(["--fitcheck-timeout", value, "job.sh"])["timeout"]
    except WrapperUsage:
        return "refused"
    except Exception as exc:  # noqa: BLE001
        return f"VIOLATION {type(exc).__name__}"
    return "accepted" if 0 < t <= 3600 else "VIOLATION accepted out of range"


T_VALUES = st.one_of(st.sampled_from(EDGE_NUMBERS + ["0.0", "-0", "3600", "3600.0001", "1e-300",
                                                   "5", " 5", "5s", "NaN", "+inf"]),
                     raw_text(), st.floats().map(repr))
"""--fitcheck-timeout values: the edges, any text, any float (nan, inf, subnormals)."""

WORST_RATIO: dict[str, float] = {}


def size_case(drawn) -> str:
    """Every candidate of a request estimated with one number small and at its largest, best
    of five each, in turns (a machine busy with other work still skews a few: rerun those)."""
    from planner.plan import One, fit_tries

    values, field = drawn
    small, big = SIZE_FIELDS[field]
    try:
        reqs = [build_request({**values, field: x}, SPEC) for x in (small, big)]
    except FitcheckError:
        return "refused"

    def work(r) -> None:
        at = One(r)
        for c in fit_tries(at):
            at.estimate(c)
            at.step(c)
    best = [float("inf")] * 2
    try:
        for _ in range(5):
            for i, r in enumerate(reqs):
                t = time.perf_counter()
                _deadline(20, lambda: work(r))
                best[i] = min(best[i], time.perf_counter() - t)
    except Hang:
        return "VIOLATION hang"
    ratio = best[1] / best[0]
    WORST_RATIO[field] = max(WORST_RATIO.get(field, 0.0), ratio)
    return "VIOLATION over 3x" if ratio > 3 else "within 3x"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", type=int, default=4000)
    ap.add_argument("--specs", type=int, default=4000)
    ap.add_argument("--metamorphic", type=int, default=2000, help="runs per property")
    ap.add_argument("--minima", type=int, default=1000, help="`--find min-gpus` requests")
    ap.add_argument("--bytes", type=int, default=2000, help="spec and job file bytes")
    ap.add_argument("--reviews", type=int, default=2000, help="webhook AdmissionReviews")
    ap.add_argument("--timeouts", type=int, default=500, help="--fitcheck-timeout values")
    ap.add_argument("--sizes", type=int, default=200, help="requests with a number at its max")
    args = ap.parse_args(argv)
    total_bad = 0
    for title, n, strategy, body in [
        ("command lines", args.cli, command_lines(), cli_case),
        ("gate specs (--on-error admit)", args.specs, specs(), spec_case),
        ("more GPUs never need more memory", args.metamorphic, plans(),
         property_case(T._more_gpus_in_a_node_never_need_more_memory)),
        ("more tokens never need less memory", args.metamorphic, plans(),
         property_case(T._more_tokens_never_need_less_memory)),
        ("found values fit", args.metamorphic // 4, plans(),
         property_case(T._found_values_fit)),
        ("found minima are minimal", args.minima, min_gpus_requests(), minimum_case),
        ("spec and job bytes (gate FILE, --job FILE, gate -; --on-error admit)", args.bytes,
         spec_bytes(), bytes_case),
        ("webhook reviews (--on-error admit)", args.reviews, reviewed_objects(), review_case),
        ("fitcheck-sbatch --fitcheck-timeout", args.timeouts, T_VALUES, timeout_case),
        ("estimating vs a number's size", args.sizes, sized_requests(), size_case),
    ]:
        if n <= 0:
            continue
        counts, secs = counted(n, strategy, body)
        bad = sum(v for k, v in counts.items() if k.startswith("VIOLATION"))
        total_bad += bad
        print(f"{title}: {sum(counts.values())} runs in {secs:.0f} s, {bad} violations; "
              + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    if WORST_RATIO:
        print("largest time ratio (field at its largest / small), per field: "
              + ", ".join(f"{k} {v:.2f}" for k, v in sorted(WORST_RATIO.items())))
    return 1 if total_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
