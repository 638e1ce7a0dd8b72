"""The planner against the trace on small shapes: every architecture x strategy x world size x
checkpointing x precision that CI checks, with the error per moment and category.

    python benchmarks/trace_matrix.py [--quick] [--effects]

tests/test_trace_accuracy.py asserts on the same matrix (probes.matrix); this prints it.
``--effects``: the training-loop effects, fine-tunes and tensor parallel instead
(probes.effects_matrix, asserted by tests/test_trace_effects.py), each row with every
moment's error and, for a case the planner is known to miss, why.
"""

from __future__ import annotations

import argparse
import collections
import time

from probes.matrix import CASES, run_case


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one precision, one world size")
    ap.add_argument("--effects", action="store_true",
                    help="the training-loop effects / fine-tune / TP matrix")
    args = ap.parse_args()
    if args.effects:
        effects()
        return
    worst: dict[str, float] = collections.defaultdict(float)
    t0 = time.perf_counter()
    n = 0
    for case in CASES:
        if args.quick and (case.world_size != 4 or case.precision != "bf16-amp"):
            continue
        c = run_case(case)
        n += 1
        errs = {k: p.rel_error for k, p in c.categories.items() if p.rel_error is not None}
        worst["peak"] = max(worst["peak"], abs(c.peak.rel_error))
        for k, v in errs.items():
            worst[k] = max(worst[k], abs(v))
        print(f"{case.label():60s} peak {100 * c.peak.rel_error:+6.2f}% "
              f"({c.traced_peak_phase}/{c.predicted_peak_phase}) "
              + " ".join(f"{k} {100 * v:+.1f}%" for k, v in errs.items()), flush=True)
    print(f"{n} configurations in {time.perf_counter() - t0:.0f} s; worst |error|: "
          + ", ".join(f"{k} {100 * v:.2f}%" for k, v in worst.items()))


def effects() -> None:
    from probes.effects_matrix import CASES as EFFECT_CASES
    from probes.effects_matrix import known
    from probes.effects_matrix import run_case as run_effect

    t0 = time.perf_counter()
    for case in EFFECT_CASES:
        c = run_effect(case)
        if not c.ok:
            print(f"{case.label():48s} FAILED {c.reason}", flush=True)
            continue
        moms = " ".join(f"{k} {100 * p.rel_error:+.1f}%" for k, p in c.moments.items())
        cats = " ".join(f"{k} {100 * p.rel_error:+.1f}%" for k, p in c.categories.items()
                        if p.rel_error is not None)
        why = known(case)
        print(f"{case.label():48s} peak {100 * c.peak.rel_error:+6.2f}% "
              f"({c.traced_peak_phase}/{c.predicted_peak_phase}) | {moms} | {cats}"
              + (f" | KNOWN: {why}" if why else ""), flush=True)
    print(f"{len(EFFECT_CASES)} configurations in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
